"""torchrun's environment, read here only: how many processes the job has, which one this is, and where it sits on its
node (WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE). Without torchrun: one process, process 0."""

from __future__ import annotations

import os


def _read(name: str, default: int) -> int:
    return int(os.environ.get(name) or default)


def torchrun_world() -> tuple[int, int, int]:
    """(world size, this process's index, its local index on the node) from torchrun's environment; (1, 0, 0) without."""
    return _read("WORLD_SIZE", 1), _read("RANK", 0), _read("LOCAL_RANK", 0)


def torchrun_rank() -> str:
    """This process's index in a torchrun job ("0" without torchrun): only process 0 speaks for the job."""
    return str(_read("RANK", 0))


def processes_per_node() -> int:
    """torchrun's --nproc-per-node (1 without torchrun)."""
    return _read("LOCAL_WORLD_SIZE", 1)
