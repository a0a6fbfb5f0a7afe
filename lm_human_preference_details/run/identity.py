"""A run's identity on resume: the options that may change and those that may not, and the reward model's fingerprint."""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import torch
from torch import nn

from lm_human_preference_details.utils.errors import UserError

# options a resumed run may change: where and how it runs, not what it computes (docs/checkpoints.md); world_size: the
# emulated ranks (--num-ranks, which may not change) draw and compute the same on any number of processes
MAY_CHANGE_ON_RESUME = {"resume", "overwrite", "output_dir", "device", "compile", "tf32", "micro_batch_sequences", "track",
                        "wandb_project", "wandb_entity", "exp_name", "first_phase", "keep_checkpoints", "save_interval",
                        "sample_print_interval", "world_size", "host", "port"}  # host, port: where the online page is served
# (online.py); exp_name, first_phase: how W&B names the run, whose checkpoint may predate them


def fingerprint(module: nn.Module) -> str:
    """A sha256 of a module's parameters and buffers: names which reward model a run trains against."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{"ppo": {"lr": 1}} -> {"ppo.lr": 1}."""
    out = {}
    for k, v in config.items():
        out.update(flat_config(v, f"{prefix}{k}.") if isinstance(v, Mapping) else {f"{prefix}{k}": v})
    return out


def check_same_run(saved: Mapping[str, Any], current: Mapping[str, Any]) -> None:
    """A resumed run must compute what the saved one did: only `MAY_CHANGE_ON_RESUME` options may differ."""
    old, new = flat_config(saved), flat_config(current)
    changed = sorted(k for k in old.keys() | new.keys()
                     if old.get(k) != new.get(k) and k.split(".")[-1] not in MAY_CHANGE_ON_RESUME)
    if changed:
        shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:4])
        raise UserError(f"cannot resume: this run's options differ from the checkpoint's ({shown}); pass the same "
                        "options, or --overwrite to start again")
