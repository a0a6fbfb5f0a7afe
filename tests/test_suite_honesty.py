"""Issue 34: the suite's own helpers keep their promises (each catches the fault it is there to catch)."""

from __future__ import annotations

import random

import numpy as np
import torch
from conftest import global_generators_kept


def test_global_generators_are_given_back_after_a_seed_and_draws():
    torch.manual_seed(0), np.random.seed(0), random.seed(0)  # draw the same numbers again
    expected = torch.rand(3), np.random.rand(3), random.random()
    torch.manual_seed(0), np.random.seed(0), random.seed(0)
    with global_generators_kept():
        torch.manual_seed(123), np.random.seed(123), random.seed(123)
        torch.rand(5), np.random.rand(5), random.random()
    after = torch.rand(3), np.random.rand(3), random.random()
    assert torch.equal(after[0], expected[0]) and np.array_equal(after[1], expected[1]) and after[2] == expected[2]
