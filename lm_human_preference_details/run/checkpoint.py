"""What a training checkpoint holds, and how it is written and read back; the non-finite guard that keeps a NaN out.

A checkpoint is one file, ``RUN/checkpoints/update_NNNNNNNN/state.pt``, written atomically after update N: the
state_dict of every object the next update depends on (policy and value head, optimizer, KL controller, query
sampler, and any object with ``state_dict``/``load_state_dict`` a caller adds), the global torch / CUDA / numpy /
Python random generators, the tracker's W&B run id, the run's config and a fingerprint of the reward model. Resuming
loads it into freshly built objects, so a resumed CPU run logs exactly the metrics of an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import torch
from torch import nn

from lm_human_preference_details.run.checksums import unverified, verify_checksums, write_checksums
from lm_human_preference_details.run.identity import check_same_run
from lm_human_preference_details.utils.errors import UserError, disk_full
from lm_human_preference_details.utils.outputs import atomic_dir
from lm_human_preference_details.utils.progress import passed
from lm_human_preference_details.utils.random_state import rng_state, set_rng_state

CHECKPOINTS = "checkpoints"
STATE_FILE = "state.pt"
RESUMABLE = ("update", "objects", "rng", "config", "tracker", "elapsed")  # what RunSaves.save writes, resume_checkpoint reads


# ----------------------------------------------------------------------------------------------- state of objects
def state_of(obj: Any) -> Any:
    """``obj.state_dict()``, or its attributes for a plain object (the KL controllers)."""
    return obj.state_dict() if hasattr(obj, "state_dict") else dict(vars(obj))


def load_state(obj: Any, state: Any) -> None:
    """The inverse of `state_of`."""
    if hasattr(obj, "load_state_dict"):
        obj.load_state_dict(state)
    else:
        vars(obj).update(state)


# ----------------------------------------------------------------------------------------------- save and load
def checkpoint_dir(run_dir: Path, update: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"update_{update:08d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporary directories of unfinished saves are hidden)."""
    root = Path(run_dir) / CHECKPOINTS
    return sorted(p for p in root.glob("update_*") if (p / STATE_FILE).is_file()) if root.is_dir() else []


def write_state(state: dict, path: Path) -> None:
    """Serialise ``state`` to ``path`` (its own function, so tests can make it fail or die half-way)."""
    torch.save(state, path)


def fall_back(path: Path) -> str:
    """What to do about the damaged checkpoint ``path``: the checkpoint before it, or --overwrite."""
    earlier = [p for p in list_checkpoints(Path(path).parent.parent) if p.name < Path(path).name]
    if earlier:
        return f"delete {path} to resume from the checkpoint before it, {earlier[-1]}"
    return "no earlier checkpoint is kept (--keep-checkpoints): --overwrite starts the run again"


@contextlib.contextmanager
def save_errors(run_dir: Path, target: Path) -> Iterator[None]:
    """Turn a failed write of ``target`` (disk full, unwritable directory) into one line naming what is kept: an
    OSError, or what torch.save (RuntimeError) or safetensors raise when the disk fills (errors.disk_full)."""
    try:
        yield
    except Exception as e:
        full = disk_full(e)
        if not (full or isinstance(e, OSError)):
            raise  # an error of another kind is a bug, with its traceback
        # a run's own reward run (RUN/reward, an online training's RUN/online/reward_KK): --resume continues the run
        # that holds it, from its checkpoint
        previous = next((c for c in map(list_checkpoints, (run_dir, *Path(run_dir).parents[:2])) if c), [])
        kept = f"the last good checkpoint is {previous[-1]}" if previous else "no checkpoint was saved before"
        why = getattr(e, "strerror", None) or ("the disk is full" if full else str(e))
        hint = "free some disk space" if full else "check the run directory"
        raise UserError(f"cannot save {target} ({why}); {kept}; {hint} and rerun with --resume") from None


def save_checkpoint(run_dir: Path, update: int, state: dict, keep: int) -> Path:
    """Write ``state`` as the checkpoint after ``update`` updates, atomically; keep the newest ``keep``.

    A failed write is one line (`save_errors`) and leaves every earlier checkpoint as it was.
    """
    path = checkpoint_dir(run_dir, update)
    with save_errors(run_dir, path), atomic_dir(path) as tmp:
        write_state(state, tmp / STATE_FILE)
        write_checksums(tmp)  # verified by load_checkpoint: a flipped bit is never resumed from
        passed(f"checkpoint-writing {update}")  # written, not yet in place: a kill here leaves only a temporary
    for old in list_checkpoints(run_dir)[:-keep]:  # only after the new one is complete
        shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(path: Path, expect: tuple[str, ...] = (), quiet: bool = False) -> dict:
    """Read a checkpoint written by `save_checkpoint`, its checksums verified; a corrupt one, or a file that is not a
    checkpoint holding the keys ``expect`` (`RESUMABLE` for a run's), is one line naming what to fall back to. One
    without checksums loads with a warning on stderr (unless ``quiet``: the processes other than 0)."""
    if not verify_checksums(path, fall_back) and not quiet:
        print(unverified(path), file=sys.stderr, flush=True)
    try:
        state = torch.load(Path(path) / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated or foreign file: name it, no traceback
        raise UserError(f"checkpoint {path} is corrupt ({type(e).__name__}: {str(e)[:200]}); {fall_back(path)}") from None
    missing = [key for key in expect if not isinstance(state, dict) or key not in state]
    if missing:
        raise UserError(f"{Path(path) / STATE_FILE} is not a training checkpoint of this project (it holds no "
                        f"{missing[0]!r}); {fall_back(path)}")
    return state


def resume_checkpoint(path: Path | None, identity: Mapping[str, Any], quiet: bool = False) -> dict:
    """The checkpoint at ``path`` that a run resumes from, its config checked against ``identity`` (`check_same_run`);
    without one, a new run's start (update 0). ``quiet``: no warning (load_checkpoint)."""
    if path is None:
        return {"update": 0, "elapsed": 0.0, "tracker": {}}
    checkpoint = load_checkpoint(path, RESUMABLE, quiet)
    checkpoint["changed"] = check_same_run(checkpoint["config"], identity)
    return checkpoint


def restore(checkpoint: dict, objects: Mapping[str, Any]) -> int:
    """Load each object's state and the random generators from ``checkpoint``; -> the next update's index."""
    for name, obj in objects.items():
        load_state(obj, checkpoint["objects"][name])
    set_rng_state(checkpoint["rng"])
    return checkpoint["update"]


def training_state(update: int, objects: Mapping[str, Any], **extra: Any) -> dict:
    """What `save_checkpoint` writes: every object's state, the random generators, and ``extra`` values."""
    return {"update": update, "objects": {name: state_of(obj) for name, obj in objects.items()}, "rng": rng_state(),
            **extra}


# ----------------------------------------------------------------------------------------------- the non-finite guard
def _finite_flags(values: Iterable[Any]) -> list[bool]:
    """One bool per value: a tensor, a number, a list of numbers, or a module's parameters."""
    flags = []
    for v in values:
        if isinstance(v, nn.Module):
            params = [p.detach() for p in v.parameters()]
            flags.append(torch.stack([torch.isfinite(p).all() for p in params]).all() if params else torch.tensor(True))
        else:
            flags.append(torch.isfinite(torch.as_tensor(v, dtype=torch.float64) if not torch.is_tensor(v) else v).all())
    return [bool(f) for f in flags]


def check_finite(where: str, **values: Any) -> None:
    """Raise a one-line UserError naming the first non-finite quantity (in argument order) and ``where``."""
    for name, ok in zip(values, _finite_flags(values.values())):
        if not ok:
            raise UserError(f"non-finite {name} at {where}: the run stops here and saves nothing from it (earlier "
                            "checkpoints are kept); lower the learning rate or check the reward model and temperature")
