"""The run options both scripts share (RunArgs: seed, ranks, micro-batches, run directory, device, tracking) and the
checks of a flag's value, each a one-line UserError. Parsing argv is parsing.py's; the device, devices.py's."""

from __future__ import annotations

import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import tyro

from lm_human_preference_details.devices import check_device
from lm_human_preference_details.errors import UserError


def check_at_least(flag: str, value: float, minimum: float, what: str) -> None:
    """A one-line UserError naming ``flag`` unless ``value`` >= ``minimum`` (``what`` says what the flag counts)."""
    if not value >= minimum:  # also catches NaN
        raise UserError(f"{flag} is {value}, but it is {what} and must be at least {minimum}; pass {flag} {minimum} or more")


def check_positive(flag: str, value: float, what: str) -> None:
    """A one-line UserError naming ``flag`` unless ``value`` is a finite number > 0."""
    if not (math.isfinite(value) and value > 0):
        raise UserError(f"{flag} is {value}, but it is {what} and must be a finite number > 0; pass a positive {flag}")


def check_in_range(flag: str, value: float, low: float, high: float, what: str, low_open: bool = False) -> None:
    """A one-line UserError naming ``flag`` unless ``low`` <= ``value`` <= ``high`` (``low`` < ``value`` if
    ``low_open``)."""
    if not ((value > low if low_open else value >= low) and value <= high):  # also catches NaN
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise UserError(f"{flag} is {value}, but it is {what} and must lie in {interval}; pass {flag} in {interval}")


def expand_home(path: Optional[str]) -> Optional[str]:
    """A path flag as the user meant it, resolved once when the flags are parsed: a leading ``~`` or ``~user`` is that
    home directory, also where the shell left it as typed (``--output-dir=~/runs``). Every check and every write then
    uses the returned value. Hub model names, oai:NAME and URLs never start with ``~``."""
    return os.path.expanduser(path) if path and path.startswith("~") else path


def check_output_dir(path: str, flag: str = "--output-dir") -> None:
    """``flag`` names a directory, or one that can be made: not a file, not under a file, not a link to nowhere,
    writable. ``path`` is the flag's value after `expand_home`. Writes nothing."""
    target = Path(path).absolute()
    if target.exists() and not target.is_dir():
        raise UserError(f"{flag} {path} is a file; pass a directory (it is made if missing)")
    existing = target
    while not existing.exists():
        if existing.is_symlink():  # a link to nowhere: making the directory would fail, or write where it points
            raise UserError(f"{flag} {path}: {existing} is a symbolic link to {os.readlink(existing)}, which does not "
                            "exist; pass a directory path without a dangling link")
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {path} lies under the file {existing}; pass a directory path with no file in it")
    try:  # a real probe: os.access says yes to root on a read-only or special file system
        os.rmdir(tempfile.mkdtemp(prefix=".lmhp-write-check-", dir=existing))
    except OSError as e:
        raise UserError(f"{flag} {path} cannot be written (making a directory in {existing} failed: "
                        f"{e.strerror or e}); pass a writable directory") from None


@dataclass
class RunArgs:
    """Options of a run that both scripts take (OAI train_reward.py: RunHParams, plus devices and tracking).

    A policy run that trains its own reward model hands all of them on (train_policy.get_reward_model).
    """

    seed: int = 1
    """random seed; rank r uses seed + r * 100003 (utils/core.py: set_mpi_seed)"""
    num_ranks: int = 8
    """the original's MPI ranks (launch.py: 8 V100s), emulated on any number of processes (torchrun, a divisor):
    each has its own seed, query stream, sampling noise, minibatch permutations and whitening group"""
    exact_ranks: bool = False
    """what: each emulated rank takes its own forward and backward passes and statistics, added in a fixed tree, so 1,
    2, 4 or 8 processes give bit-identical runs (with equal CPU threads per process); cost: a process runs one pass
    per rank it holds instead of one fused pass (measured in docs/ranks.md). Off: the same maths up to float
    summation order. On in the offline demo"""
    micro_batch_sequences: int = 0
    """query-response sequences per forward pass, to fit memory (0: all at once): a sampled query or an episode is one,
    a reward label one per candidate (4 for best_of_4); gradients are accumulated, the maths is unchanged"""
    output_dir: Optional[str] = None
    """run directory for logs and saved models (default runs/<reward|policy>_<task>_seed<seed>)"""
    device: str = "auto"
    """torch device: auto (cuda if available), cpu, cuda, cuda:1 ..."""
    tf32: bool = True
    """TF32 matmuls on CUDA (a numerics deviation from the original's fp32, README); --no-tf32 for full fp32"""
    compile: bool = False
    """torch.compile the GPT-2 blocks' layer norms, GELU and residual adds (same maths; a slow first update, docs/speed.md)"""
    track: bool = False
    """also log to Weights & Biases"""
    wandb_project: str = "lm-human-preferences"
    """W&B project"""
    wandb_entity: Optional[str] = None
    """W&B entity (team or user)"""
    resume: bool = False
    """continue the run in --output-dir from its last checkpoint (a reward model run: reuse it if finished, else
    train it again); a directory without a run starts afresh, so a requeued job can always pass it"""
    overwrite: bool = False
    """delete the run already in --output-dir and start again (without --resume or this, such a directory is refused)"""
    keep_checkpoints: int = 1
    """training checkpoints kept in RUN/checkpoints, newest first; an older one is deleted only after a newer one
    is complete"""
    task_name: tyro.conf.Suppress[str] = "sentiment"
    world_size: tyro.conf.Suppress[int] = 1
    """processes the emulated ranks ran on (torchrun's WORLD_SIZE), recorded in config.json"""

    def finalize_run(self, kind: str, sequences_per_row: int = 1, **sizes: int) -> None:
        """The checks and defaults both scripts share: --micro-batch-sequences holds whole rows (a row: an episode, or a
        label of ``sequences_per_row`` sequences) and divides each named size (in rows); the device; the run directory,
        writable. Run before anything loads, so a bad option ends in one line at once."""
        micro = self.micro_batch_sequences
        check_at_least("--micro-batch-sequences", micro, 0, "query-response sequences per forward pass (0: all)")
        if micro % sequences_per_row:
            raise UserError(f"--micro-batch-sequences ({micro}) must be a multiple of {sequences_per_row}: a label is "
                            f"{sequences_per_row} query-response sequences, scored together")
        for name, n in sizes.items():
            if micro and n % (micro // sequences_per_row):
                raise UserError(f"--micro-batch-sequences ({micro}) must hold a divisor of {name} ({n}) rows of "
                                f"{sequences_per_row} sequence(s); pick {sequences_per_row} x a divisor of {n}")
        if self.keep_checkpoints < 1:
            raise UserError(f"--keep-checkpoints ({self.keep_checkpoints}) must be at least 1")
        if self.output_dir is None:
            self.output_dir = f"runs/{kind}_{self.task_name}_seed{self.seed}"
        self.output_dir = expand_home(self.output_dir)  # the one value every check and write uses
        check_output_dir(self.output_dir)
        check_device(self.device)

    def micro_batches(self, n: int, default: int | None = None, sequences_per_row: int = 1) -> list[slice]:
        """The slices of ``n`` rows (of ``sequences_per_row`` sequences each) that one forward pass takes at a time:
        --micro-batch-sequences, else ``default`` rows, else all."""
        size = self.micro_batch_sequences // sequences_per_row or default or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]
