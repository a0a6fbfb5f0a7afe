"""utils/random_state.py: the global generators' state taken and given back, on the hardware there is now."""

import random

import numpy as np
import torch

from lm_human_preference_details.utils import random_state


def test_random_generators_come_back():
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    state = random_state.rng_state()
    draws = torch.rand(3), np.random.rand(3), random.random()
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    random_state.set_rng_state(state)
    again = torch.rand(3), np.random.rand(3), random.random()
    assert torch.equal(draws[0], again[0]) and np.array_equal(draws[1], again[1]) and draws[2] == again[2]


def test_a_checkpoint_naming_more_gpus_than_visible_restores_the_visible_ones(monkeypatch):
    """Saved on 8 GPUs (here 3 crafted states), resumed where one is visible (Docker --gpus '"device=3"')."""
    saved = {**random_state.rng_state(), "cuda": [torch.full((16,), i, dtype=torch.uint8) for i in range(3)]}
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: restored.append((device, state[0].item())))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: restored.extend(enumerate(states)))
    random_state.set_rng_state(saved)
    assert restored == [(0, 0)]  # GPU 0 takes the saved GPU 0's state; the others are not there
