"""tests/fixtures/oai_tiny_run, the run the original repository's own code wrote (tests/fixtures/make_oai_checkpoint.py),
and what that code computed from it (expected.json)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "oai_tiny_run"


EXPECTED = json.loads((FIXTURE / "expected.json").read_text())


TOL = 1e-5  # float32 on both sides, in another order of operations (tests/language/test_oai_checkpoints.py)


def fixture_tokens(pad_id: int) -> torch.Tensor:
    """The fixture's tokens with its pad (n_vocab + 2, as the original's encoder) mapped to ours (FIDELITY A2)."""
    tokens = torch.tensor(EXPECTED["tokens"])
    return torch.where(tokens == EXPECTED["pad"], torch.full_like(tokens, pad_id), tokens)
