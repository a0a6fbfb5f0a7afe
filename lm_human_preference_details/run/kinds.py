"""What each kind of run is, decided here once and read by every module that asks: the name its directory's marker holds,
the entries it writes (the only ones --overwrite deletes), the saved model that marks it finished, whether it keeps
training checkpoints that --resume continues from, whether it can be resumed at all, and whether it draws curves."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# what runs write at the top of their directory (tracking.py, checkpoint.py, model.py, the offline task's report):
# the only entries --overwrite and a restarted reward run delete; "reward" is a policy run's own reward run
RUN_ENTRIES = ("config.json", "metrics.jsonl", "events.out.tfevents.*", "wandb", "checkpoints", "reward_model",
               "policy", "reward", "summary.json", "curves.png", "online")
SAMPLE_ENTRIES = ("samples.jsonl", "config.json", "metrics.jsonl", "events.out.tfevents.*", "wandb")  # sample.py's


@dataclass(frozen=True)
class RunKind:
    """A kind of run (module docstring)."""

    name: str
    """the marker's "kind", and the default directory's prefix (runs/<name>_<task>_seed<seed>)"""
    entries: tuple[str, ...]
    """the entries it writes at the top of its directory, as patterns"""
    finished: Optional[str] = None
    """the entry whose presence marks the run finished (saved atomically): --resume reuses it, else trains again"""
    checkpoints: bool = False
    """it keeps training checkpoints in RUN/checkpoints, and --resume continues from the last"""
    resumable: bool = True
    """--resume applies (sampling is only ever done again: --overwrite)"""
    curves: bool = False
    """each save also draws RUN/curves.png"""


RUN_KINDS = {kind.name: kind for kind in (
    RunKind("reward", RUN_ENTRIES, finished="reward_model"),  # the two training scripts
    RunKind("policy", RUN_ENTRIES, checkpoints=True, curves=True),
    RunKind("sample", SAMPLE_ENTRIES, resumable=False),  # sample.py's output directory
)}
