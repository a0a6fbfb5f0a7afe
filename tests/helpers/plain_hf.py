"""Saved model directories read as other code reads them, with plain transformers only: greedy generation on a padded
batch and prompt by prompt, our policy's argmax done the slow way, and OpenRLHF's reward computed as its code reads."""

from __future__ import annotations

import json
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


def openrlhf_rewards(path: Path, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """[b, t] ids and mask -> [b] rewards as OpenRLHF's reward model computes them from a directory: the base model
    with positions cumsum(mask) - 1, config.value_head_prefix's Linear at the last attended position, then (r - mean)
    / std from config.json when normalize_reward is set."""
    from safetensors import safe_open
    from transformers import AutoModel

    config = json.loads((Path(path) / "config.json").read_text())
    base = AutoModel.from_pretrained(path)
    with safe_open(str(Path(path) / "model.safetensors"), "pt") as f:
        weight = f.get_tensor(f"{config['value_head_prefix']}.weight")  # [1, d]
    positions = (attention_mask.long().cumsum(-1) - 1).masked_fill(attention_mask == 0, 1)
    with torch.no_grad():
        h = base(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).last_hidden_state
    values = (h @ weight.t()).squeeze(-1)  # [b, t]
    last = attention_mask.shape[1] - 1 - attention_mask.long().fliplr().argmax(dim=1, keepdim=True)  # [b, 1]
    reward = values.gather(1, last).squeeze(1)
    return (reward - config["mean"]) / config["std"] if config.get("normalize_reward") else reward


def plain_pairs(tokens: torch.Tensor, pad_id: int, hf_pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, t] query-responses padded anywhere with our ``pad_id`` -> (their real tokens right-padded with ``hf_pad_id``,
    the attention mask), as other code feeds a batch."""
    rows = [[t for t in row if t != pad_id] for row in tokens.tolist()]
    width = max(map(len, rows))
    ids = torch.tensor([row + [hf_pad_id] * (width - len(row)) for row in rows])
    mask = torch.tensor([[1] * len(row) + [0] * (width - len(row)) for row in rows])
    return ids, mask
