"""A saved model directory as plain Hugging Face code reads it: a pad the model can embed, left padding, the reward as
`GPT2ForSequenceClassification`'s `score`, and OpenRLHF's reward-model config.

Training pads with [PAD] = 50257, a token GPT-2 has no embedding for (FIDELITY B1 pad mask and positions); that stays
ours. The saved directory tells other code to pad with EOS (50256) instead, a policy on the left: `generate` and
`pipeline("text-generation")` mask those pads, so they never reach a forward pass as tokens; a reward model on the right,
where a sequence classifier's positions are right. `load_tokenizer` adds our
[PAD] back when it reads such a directory.

The reward is gain * (w . h + b) + bias at the last real token, and h is the output of GPT-2's final LayerNorm,
gamma * n + beta. A `score` Linear has no bias, so the saved `score.weight` is gain * w and the constant gain * b + bias
is folded into beta: beta + c * w' / |w'|^2 adds exactly c to w' . h. The plain logit is then our reward, for
`AutoModelForSequenceClassification`, the text-classification pipeline, OpenRLHF, vLLM's `/classify` and verl alike;
`head.safetensors` keeps the trained beta, so our own loader reads back the model as trained. The config's
`reward_offset` is what is left to add: 0 when folded (a base model without a final-norm bias keeps the constant there,
as directories saved before the fold do).
"""

from __future__ import annotations

import copy
import functools
import json
import threading
from pathlib import Path

import torch
from torch import nn

PADDING_SIDES = {"policy": "left", "reward": "right"}  # generation pads on the left (transformers warns on the right);
# GPT2ForSequenceClassification numbers positions 0, 1, ... whatever the mask says: a reward model pads on the right
REWARD_OFFSET = "reward_offset"  # config.json: reward = score logit + reward_offset (0 once folded into the weights)
REWARD_LABELS = {"problem_type": "regression", "id2label": {0: "reward"}, "label2id": {"reward": 0}}  # one raw scalar:
# the text-classification pipeline applies no sigmoid to a regression's logit
# The messages' texts one after the other, nothing between them and no generation prompt: a query as one user message
# and its response as the assistant's give query + response, the text our models read. Code that formats chats with
# the tokenizer (verl's RL data and reward loop) then sees our plain texts; `generate` and TRL's standard (not
# conversational) data never use it.
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"
_LENT = threading.Lock()  # held while a save lends a live tokenizer PLAIN_CHAT_TEMPLATE
SCORE = "score"  # GPT2ForSequenceClassification's head, and OpenRLHF's default value_head_prefix


def plain_pad_id(tokenizer) -> int:
    """The pad id other code uses on a saved directory: EOS, a real token the model embeds (masked when padding)."""
    return tokenizer.eos_token_id


def reward_score(head: nn.Linear, gain: torch.Tensor, bias: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Our reward head -> ([1, d] weight of a bias-free `score` Linear, offset): reward = score . h + offset."""
    # gain * (w . h + b) + bias = (gain * w) . h + (gain * b + bias)
    with torch.no_grad():
        return (gain * head.weight).float().cpu().contiguous(), float(gain * head.bias.squeeze() + bias)  # [1, d], offset


def final_norm_bias(lm: nn.Module) -> str | None:
    """The state-dict name of the bias of ``lm``'s final norm, whose output the heads read (GPT-2:
    `transformer.ln_f.bias`), or None when it has none (an RMSNorm)."""
    for name in ("ln_f", "norm", "final_layernorm", "final_layer_norm"):
        if isinstance(getattr(getattr(lm.base_model, name, None), "bias", None), torch.Tensor):
            return f"{lm.base_model_prefix}.{name}.bias"
    return None


def fold_offset(beta: torch.Tensor, weight: torch.Tensor, offset: float) -> torch.Tensor:
    """[d] final-norm bias, [1, d] score weight w, offset c -> [d] beta + c * w / |w|^2, so that w . beta gains c."""
    w = weight[0].double()  # [d]
    return (beta.double() + offset * w / w.dot(w)).to(beta.dtype)


def policy_sampling(temperature: float, response_length: int | None) -> dict:
    """A policy's sampling as a GenerationConfig's fields: the softmax at the task's temperature, no top-k or top-p,
    the task's response length (FIDELITY C1 plain sampling)."""
    # OAI lm_human_preferences/language/sample.py: sample_sequence (temperature, top_k 0, top_p 1, length)
    length = {"max_new_tokens": response_length} if isinstance(response_length, int) else {}
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0, **length}


def save_plain_lm(lm: nn.Module, path: Path, pad_id: int, score: tuple[torch.Tensor, float] | None = None,
                  sampling: dict | None = None) -> float | None:
    """``lm`` via save_pretrained, its config and generation config padding with ``pad_id``; a reward model's ``score``
    (weight, offset) also as a sequence classifier's: `score.weight` in the weights, the offset folded into the final
    norm's bias (`fold_offset`), its config's architecture, one regression label and the `reward_offset` left (0)
    -> that offset left (None for a policy); a policy's ``sampling`` (`policy_sampling`) in its generation config."""
    # transformers takes seconds to import: a flag's error line never waits for it
    from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as CLASSIFIERS

    state_dict, offset = None, None
    config = copy.deepcopy(lm.config)
    config.pad_token_id = pad_id
    config.architectures = [type(lm).__name__]  # what save_pretrained would write
    if score is not None:
        weight, offset = score
        dtype = lm.get_input_embeddings().weight.dtype
        state_dict = {**lm.state_dict(), f"{SCORE}.weight": weight.to(dtype)}
        beta = final_norm_bias(lm)
        if beta is not None and weight.abs().sum() > 0:
            state_dict[beta] = fold_offset(state_dict[beta], weight, offset)
            offset = 0.0
        config.num_labels = 1  # one scalar: AutoModelForSequenceClassification builds a [1, d] score
        for key, value in REWARD_LABELS.items():
            setattr(config, key, value)
        setattr(config, REWARD_OFFSET, offset)
        config.architectures = [CLASSIFIERS.get(config.model_type, config.architectures[0])]  # vLLM, verl, the Hub
    lm.save_pretrained(path, state_dict=state_dict)
    config.save_pretrained(path)  # over the one save_pretrained wrote from the live config, which training keeps as is
    if getattr(lm, "generation_config", None) is not None:
        generation = copy.deepcopy(lm.generation_config)
        generation.pad_token_id = pad_id
        generation.update(**(sampling or {}))  # `generate` and pipeline() sample as the task does by default
        generation.save_pretrained(path)
    return offset


@functools.lru_cache(maxsize=2)
def plain_tokenizer_json(saved: str, n_embeddings: int) -> str:
    """tokenizer.json's text as save_pretrained wrote it -> the same without the added tokens past the model's
    ``n_embeddings`` rows. The last texts are kept: a run saves its one tokenizer at each checkpoint, and its 3.5 MB of
    JSON take ~0.2 s to parse and write again on a 2-core VM."""
    data = json.loads(saved)
    data["added_tokens"] = [t for t in data.get("added_tokens", []) if t["id"] < n_embeddings]
    return json.dumps(data, ensure_ascii=False)


def save_plain_tokenizer(tokenizer, path: Path, n_embeddings: int, kind: str) -> None:
    """``tokenizer`` via save_pretrained, without the tokens past the model's ``n_embeddings`` rows (our [PAD]),
    padding with EOS (`plain_pad_id`) on the side a ``kind`` ('policy' or 'reward') model needs, and with
    `PLAIN_CHAT_TEMPLATE` unless it has a chat template of its own."""
    with _LENT:  # the one tokenizer a process reads from a directory (`load_tokenizer`) may be saved by two savers
        own = tokenizer.chat_template
        tokenizer.chat_template = own or PLAIN_CHAT_TEMPLATE
        try:
            tokenizer.save_pretrained(path)
        finally:
            tokenizer.chat_template = own  # the live tokenizer as it was
    fast = path / "tokenizer.json"
    if fast.is_file():
        fast.write_text(plain_tokenizer_json(fast.read_text(encoding="utf-8"), n_embeddings), encoding="utf-8")
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
    """Turn a saved reward model's config.json into OpenRLHF's: its reward is the plain `score` at the last attended
    token (value_head_prefix `score`), normalize_reward off; mean and std say the same constant our reward differs by (0
    once folded), should its normalisation be switched on."""
    config_file = path / "config.json"
    config = json.loads(config_file.read_text())
    config.update({"normalize_reward": False, "mean": -config[REWARD_OFFSET], "std": 1.0, "value_head_prefix": SCORE})
    config_file.write_text(json.dumps(config, indent=2) + "\n")
