"""A run's identity on resume: the options that may change and those that may not, and the reward model's fingerprint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from lm_human_preference_details.utils.errors import UserError

# options a resumed run may change: where and how it runs, not what it computes (docs/checkpoints.md); world_size: the
# emulated ranks (--num-ranks, which may not change) draw and compute the same on any number of processes
MAY_CHANGE_ON_RESUME = {"resume", "overwrite", "output_dir", "device", "compile", "tf32", "micro_batch_sequences", "track",
                        "wandb_project", "wandb_entity", "exp_name", "first_phase", "keep_checkpoints", "save_interval",
                        "sample_print_interval", "world_size", "host", "port",  # host, port: where the online page is
                        "online.command", "online.timeout"}  # served; the online labeller's program: fixed, it resumes
# exp_name, first_phase: how W&B names the run, whose checkpoint may predate them


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


def check_same_run(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """A resumed run must compute what the saved one did: only `MAY_CHANGE_ON_RESUME` options (a key's last part or
    the whole key) may differ -> the online labeller's options that did ("online.command 'a' -> 'b'"), to say once."""
    old, new = flat_config(saved), flat_config(current)
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    changed = [k for k in differ if k.split(".")[-1] not in MAY_CHANGE_ON_RESUME and k not in MAY_CHANGE_ON_RESUME]
    if changed:
        shown = ", ".join(f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in changed[:4])
        raise UserError(f"cannot resume: this run's options differ from the checkpoint's ({shown}); pass the same "
                        "options, or --overwrite to start again")
    return [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in differ if k.startswith("online.")]


def check_resumed_config(path: Path, config: dict) -> None:
    """``config`` against a resumed run's config.json (its last start's, which passed the checkpoint's check), before
    anything is trained or written: an option that may not change is refused now, not after a reward model trained or
    online/ was written (the checkpoint's own check follows when the run starts)."""
    try:
        saved = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return
    if isinstance(saved, dict):
        check_same_run(saved, json.loads(json.dumps(config, default=str)))
