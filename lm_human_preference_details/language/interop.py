"""A saved model directory as plain Hugging Face code reads it: a pad the model can embed, left padding, the reward as
`GPT2ForSequenceClassification`'s `score`, and OpenRLHF's reward-model config.

Training pads with [PAD] = 50257, a token GPT-2 has no embedding for (FIDELITY B1 pad mask and positions); that stays
ours. The saved directory tells other code to pad with EOS (50256) instead, a policy on the left: `generate` and
`pipeline("text-generation")` mask those pads, so they never reach a forward pass as tokens; a reward model on the right,
where a sequence classifier's positions are right. `load_tokenizer` adds our
[PAD] back when it reads such a directory.

The reward is gain * (w . h + b) + bias at the last real token. A `score` Linear has no bias, so the saved `score.weight`
is gain * w and the constant gain * b + bias is the config's `reward_offset`: reward = score + reward_offset. OpenRLHF's
reward model computes (score - mean) / std; mean = -reward_offset and std = 1 give our reward exactly.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

PADDING_SIDES = {"policy": "left", "reward": "right"}  # generation pads on the left (transformers warns on the right);
# GPT2ForSequenceClassification numbers positions 0, 1, ... whatever the mask says: a reward model pads on the right
REWARD_OFFSET = "reward_offset"  # config.json: reward = score logit + reward_offset
SCORE = "score"  # GPT2ForSequenceClassification's head, and OpenRLHF's default value_head_prefix


def plain_pad_id(tokenizer) -> int:
    """The pad id other code uses on a saved directory: EOS, a real token the model embeds (masked when padding)."""
    return tokenizer.eos_token_id


def reward_score(head: nn.Linear, gain: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Our reward head -> ([1, d] weight of a bias-free `score` Linear, offset): reward = score . h + offset."""
    # gain * (w . h + b) + bias = (gain * w) . h + (gain * b + bias)
    with torch.no_grad():
        return (gain * head.weight).float().cpu().contiguous(), float(gain * head.bias.squeeze() + bias)  # [1, d], offset


def save_plain_lm(lm: nn.Module, path: Path, pad_id: int, score: tuple[torch.Tensor, float] | None = None) -> None:
    """``lm`` via save_pretrained, its config and generation config padding with ``pad_id``; a reward model's ``score``
    (weight, offset) also as `score.weight` in the weights and num_labels 1 and `reward_offset` in the config."""
    state_dict = None
    config = copy.deepcopy(lm.config)
    config.pad_token_id = pad_id
    config.architectures = [type(lm).__name__]  # what save_pretrained would write
    if score is not None:
        weight, offset = score
        state_dict = {**lm.state_dict(), f"{SCORE}.weight": weight.to(lm.get_input_embeddings().weight.dtype)}
        config.num_labels = 1  # one scalar: AutoModelForSequenceClassification builds a [1, d] score
        setattr(config, REWARD_OFFSET, offset)
    lm.save_pretrained(path, state_dict=state_dict)
    config.save_pretrained(path)  # over the one save_pretrained wrote from the live config, which training keeps as is
    if getattr(lm, "generation_config", None) is not None:
        generation = copy.deepcopy(lm.generation_config)
        generation.pad_token_id = pad_id
        generation.save_pretrained(path)


def save_plain_tokenizer(tokenizer, path: Path, n_embeddings: int, kind: str) -> None:
    """``tokenizer`` via save_pretrained, without the tokens past the model's ``n_embeddings`` rows (our [PAD]),
    padding with EOS (`plain_pad_id`) on the side a ``kind`` ('policy' or 'reward') model needs."""
    tokenizer.save_pretrained(path)
    fast = path / "tokenizer.json"
    if fast.is_file():
        data = json.loads(fast.read_text(encoding="utf-8"))
        data["added_tokens"] = [t for t in data.get("added_tokens", []) if t["id"] < n_embeddings]
        fast.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
    config_file = path / "tokenizer_config.json"
    config = json.loads(config_file.read_text(encoding="utf-8"))
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        config["added_tokens_decoder"] = {k: v for k, v in decoder.items() if int(k) < n_embeddings}
    config["pad_token"] = tokenizer.eos_token
    config["padding_side"] = PADDING_SIDES[kind]
    config_file.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    special = path / "special_tokens_map.json"
    if special.is_file():
        tokens = json.loads(special.read_text(encoding="utf-8"))
        tokens["pad_token"] = tokenizer.eos_token
        special.write_text(json.dumps(tokens, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def openrlhf_config(path: Path) -> None:
    """Turn a saved reward model's config.json into OpenRLHF's: (score - mean) / std with mean = -reward_offset, std 1,
    normalize_reward on, value_head_prefix `score`."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config.update({"normalize_reward": True, "mean": -config[REWARD_OFFSET], "std": 1.0, "value_head_prefix": SCORE})
    config_file.write_text(json.dumps(config, indent=2) + "\n")
