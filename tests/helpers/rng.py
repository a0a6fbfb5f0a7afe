"""The global random generators, given back as they were."""

from __future__ import annotations

import contextlib
import random
from typing import Iterator

import numpy as np
import torch


@contextlib.contextmanager
def global_generators_kept() -> Iterator[None]:
    """Give back torch's (CPU and, once started, CUDA), numpy's and Python's global generators as they were before the
    block, whatever it drew or seeded."""
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(states[0])
        np.random.set_state(states[1])
        random.setstate(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)
