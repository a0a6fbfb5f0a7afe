"""The tiny policy's forward done the slow way, and its packed switch, for the tests of the model and its packed forward."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from lm_human_preference_details.language.model import Policy

PAD = 50257


@contextlib.contextmanager
def packed_as(policy: Policy, packed: bool) -> Iterator[Policy]:
    """``policy`` with ``packed`` set inside the block and its default (True) back after it, whatever happens: the
    module's other tests share it."""
    policy.packed = packed
    try:
        yield policy
    finally:
        policy.packed = True


def naive_forward(lm, tokens):
    """The original's semantics done the slow way: drop the pads, run the plain LM, spread outputs back."""
    real = tokens[tokens != PAD]
    with torch.no_grad():
        h = lm.base_model(input_ids=real[None]).last_hidden_state[0]  # [n_real, d]
    out, j = [], -1
    for t in tokens.tolist():
        j += t != PAD
        out.append(h[j])
    return torch.stack(out)
