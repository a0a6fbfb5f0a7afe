"""The global random generators' state (torch CPU and CUDA, numpy, Python), taken and restored, in types a checkpoint's
`torch.load(weights_only=True)` reads back: a checkpoint saves it, an emulated rank keeps its own, the online
collection leaves it untouched around a training."""

from __future__ import annotations

import random
from typing import Any, Mapping

import numpy as np
import torch


def pack_numpy_state(state: tuple) -> dict[str, Any]:
    """A numpy RandomState's state in types `torch.load(weights_only=True)` reads back (its key as a tensor)."""
    kind, keys, pos, has_gauss, gauss = state
    return {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
            "gauss": float(gauss)}


def unpack_numpy_state(n: Mapping[str, Any]) -> tuple:
    """The inverse of `pack_numpy_state`, for `RandomState.set_state`."""
    return n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]


def rng_state() -> dict[str, Any]:
    """The global torch (CPU and every CUDA device), numpy and Python random generators' states."""
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": pack_numpy_state(np.random.get_state()),
        "python": random.getstate(),
    }


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore what `rng_state` returned, on the hardware there is now: the CUDA states of the devices visible here
    (GPU i takes the saved GPU i's; a checkpoint saved with more GPUs visible, or on a CPU, is fine)."""
    torch.set_rng_state(state["torch"])
    if state["cuda"] and torch.cuda.is_available():
        for i, cuda_state in enumerate(state["cuda"][: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(cuda_state, i)
    np.random.set_state(unpack_numpy_state(state["numpy"]))
    random.setstate(state["python"])
