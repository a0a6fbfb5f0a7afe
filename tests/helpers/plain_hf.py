"""Saved model directories read as other code reads them, with plain transformers only: greedy generation on a padded
batch and prompt by prompt, our policy's argmax done the slow way, and a reward model loaded and read as OpenRLHF does."""

from __future__ import annotations

from pathlib import Path

import torch

PROMPTS = ["The river", "An old man walked into the garden and", "A", "Once upon a time there was a cat who"]


def greedy_batch_and_alone(path: Path, prompts: list[str], new_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """AutoModelForCausalLM and AutoTokenizer of ``path``: greedy continuations of ``prompts`` padded into one batch,
    and of each prompt alone -> (batch's, alone's) lists of token ids."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    with torch.no_grad():
        out = model.generate(**batch, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        together = out[:, batch["input_ids"].shape[1]:].tolist()
        alone = []
        for prompt in prompts:
            one = tokenizer([prompt], return_tensors="pt")
            alone.append(model.generate(**one, do_sample=False, max_new_tokens=new_tokens,
                                        min_new_tokens=new_tokens)[0, one["input_ids"].shape[1]:].tolist())
    return together, alone


def our_argmax(policy, tokenizer, prompts: list[str], new_tokens: int) -> list[list[int]]:
    """Our Policy's greedy continuations, the slow way: right-padded with our [PAD], the argmax of its logits at the last
    real token, appended after the pads (they are never attended to and do not advance positions)."""
    from lm_human_preference_details.language.tokenizer import encode_plain

    ids = encode_plain(tokenizer, prompts)
    width = max(map(len, ids))
    tokens = torch.tensor([row + [policy.pad_id] * (width - len(row)) for row in ids])  # [b, width]
    with torch.no_grad():
        for _ in range(new_tokens):
            logits, _ = policy(tokens)  # [b, t, n_vocab]
            tokens = torch.cat([tokens, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return tokens[:, width:].tolist()


def openrlhf_rewards(path: Path, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     normalize_reward: bool = False) -> torch.Tensor:
    """[b, t] ids and mask -> [b] rewards as OpenRLHF 0.11's `get_llm_for_sequence_regression(path, "reward")` loads a
    directory and its `RewardModel.forward` reads it (openrlhf/models/model.py): a class made from the config's
    AutoModel base class plus a bias-free Linear named by config.value_head_prefix, loaded by from_pretrained, positions
    cumsum(mask) - 1, the value at the last attended token, (r - mean) / std when ``normalize_reward`` (its
    --reward.normalize_enable, which overwrites the config's normalize_reward). Raises if a weight it needs is missing."""
    from torch import nn
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(path)
    config.normalize_reward = normalize_reward
    value_head_prefix = getattr(config, "value_head_prefix", "score")
    base_class = AutoModel._model_mapping[type(config)]

    class RewardModel(base_class.__base__):
        def __init__(self, config):
            super().__init__(config)
            setattr(self, self.base_model_prefix, base_class(config))
            setattr(self, value_head_prefix, nn.Linear(config.hidden_size, 1, bias=False))
            self.normalize_reward = config.normalize_reward
            self.register_buffer("mean", torch.zeros(1), persistent=False)
            self.register_buffer("std", torch.ones(1), persistent=False)
            if hasattr(config, "mean"):
                self.mean[0], self.std[0] = config.mean, config.std
            self.post_init()

    model, info = RewardModel.from_pretrained(path, config=config, output_loading_info=True)
    if info["missing_keys"]:
        raise ValueError(f"OpenRLHF would initialise {sorted(info['missing_keys'])} at random")
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    eos_indices = attention_mask.size(1) - 1 - attention_mask.long().fliplr().argmax(dim=1, keepdim=True)  # [b, 1]
    with torch.no_grad():
        h = getattr(model, model.base_model_prefix)(input_ids, attention_mask=attention_mask,
                                                    position_ids=positions)["last_hidden_state"]
        reward = getattr(model, value_head_prefix)(h).squeeze(-1).gather(1, eos_indices).squeeze(1)  # [b]
    return (reward - model.mean) / model.std if model.normalize_reward else reward


def plain_pairs(tokens: torch.Tensor, pad_id: int, hf_pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, t] query-responses padded anywhere with our ``pad_id`` -> (their real tokens right-padded with ``hf_pad_id``,
    the attention mask), as other code feeds a batch."""
    rows = [[t for t in row if t != pad_id] for row in tokens.tolist()]
    width = max(map(len, rows))
    ids = torch.tensor([row + [hf_pad_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return ids, mask
