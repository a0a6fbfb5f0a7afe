"""What a training checkpoint holds, and how it is written and read back (when and where to save is run.py's).

A checkpoint is one file, ``RUN/checkpoints/update_NNNNNNNN/state.pt``, written atomically after update N: the
state_dict of every object the next update depends on (policy and value head, optimizer, KL controller, query
sampler, and any object with ``state_dict``/``load_state_dict`` a caller adds), the global torch / CUDA / numpy /
Python random generators, the tracker's W&B run id, the run's config and a fingerprint of the reward model. Resuming
loads it into freshly built objects, so a resumed CPU run logs exactly the metrics of an uninterrupted one.
`BackgroundSaver` writes it in a thread from a copy in CPU memory: the training loop waits only for the copy.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import os
import random
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import numpy as np
import torch
from torch import nn

from lm_human_preference_details.errors import UserError
from lm_human_preference_details.files import atomic_path, disk_full, sha256_of

EVENTS = "LMHP_TEST_EVENTS"  # tests' hook (`event`): unset in every real run
CHECKPOINTS = "checkpoints"
STATE_FILE = "state.pt"
CHECKSUMS = "SHA256SUMS"  # beside state.pt, in sha256sum's format: `sha256sum -c SHA256SUMS` checks it by hand too
RESUMABLE = ("update", "objects", "rng", "config", "tracker", "elapsed")  # what RunSaves.save writes, resume_checkpoint reads
# options a resumed run may change: where and how it runs, not what it computes (docs/checkpoints.md); world_size: the
# emulated ranks (--num-ranks, which may not change) draw and compute the same on any number of processes (ranks.py)
MAY_CHANGE_ON_RESUME = {"resume", "overwrite", "output_dir", "device", "compile", "tf32", "micro_batch_sequences", "track",
                        "wandb_project", "wandb_entity", "keep_checkpoints", "save_interval", "sample_print_interval",
                        "world_size", "host", "port",  # host, port: where the online page is served (online.py)
                        "online.command", "online.timeout"}  # the online labeller's program: fixed, it resumes the run


# ----------------------------------------------------------------------------------------------- random generators
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


# ----------------------------------------------------------------------------------------------- tests' hook
def event(text: str) -> None:
    """Tests' hook, off unless $LMHP_TEST_EVENTS names a file: append ``text`` ("update N", "checkpoint-writing N") to
    it as a line, then stop this process (SIGSTOP) until the test continues it (SIGCONT). A test (tests/test_run.py)
    thus kills, stops or races a run at exactly that point, never after a guessed time."""
    path = os.environ.get(EVENTS)
    if path:
        with open(path, "a") as f:
            f.write(text + "\n")
        os.kill(os.getpid(), signal.SIGSTOP)


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


def write_checksums(directory: Path) -> None:
    """DIRECTORY/SHA256SUMS: the sha256 of each file in ``directory``, one ``HEX  NAME`` line each (sha256sum's)."""
    files = sorted(p for p in Path(directory).iterdir() if p.is_file() and p.name != CHECKSUMS)
    (Path(directory) / CHECKSUMS).write_text("".join(f"{sha256_of(p)}  {p.name}\n" for p in files))


def fall_back(path: Path) -> str:
    """What to do about the damaged checkpoint ``path``: the checkpoint before it, or --overwrite."""
    earlier = [p for p in list_checkpoints(Path(path).parent.parent) if p.name < Path(path).name]
    if earlier:
        return f"delete {path} to resume from the checkpoint before it, {earlier[-1]}"
    return "no earlier checkpoint is kept (--keep-checkpoints): --overwrite starts the run again"


def verify_checksums(path: Path) -> bool:
    """Every file of the checkpoint ``path`` is named in its SHA256SUMS with its sha256, else a one-line UserError
    naming the file and the checkpoint to fall back to; -> False when there is no SHA256SUMS to check (a checkpoint
    saved before checksums were written, or one whose sums file was deleted: the caller says it is unverified)."""
    sums = Path(path) / CHECKSUMS
    if not sums.is_file():
        return False
    listed: dict[str, str] = {}
    for number, line in enumerate(sums.read_text(errors="replace").splitlines(), 1):
        digest, _, name = line.partition("  ")
        if not name or len(digest) != 64 or name in listed:
            raise UserError(f"checkpoint {path} is corrupt: line {number} of {sums} is not one `SHA256  NAME` of a file "
                            f"named once; {fall_back(path)}")
        listed[name] = digest
    files = {p.name for p in Path(path).iterdir() if p.name != CHECKSUMS}
    unnamed = sorted(files - set(listed))  # an empty SHA256SUMS names no file: state.pt is unnamed
    if unnamed:
        raise UserError(f"checkpoint {path} is corrupt: {sums} does not name {Path(path) / unnamed[0]}, so it cannot be "
                        f"checked; {fall_back(path)}")
    for name, digest in listed.items():
        file = Path(path) / name
        if not file.is_file() or sha256_of(file) != digest:
            raise UserError(f"checkpoint {path} is corrupt: {file} does not match its sha256 in {sums}; {fall_back(path)}")
    return True


def unverified(path: Path) -> str:
    """The line a checkpoint without SHA256SUMS is loaded with (docs/checkpoints.md: a warning, not a refusal)."""
    return (f"warning: checkpoint {path} has no {CHECKSUMS}, so its files are loaded unverified (saved before "
            f"checksums existed, or the file was deleted); if it may be damaged, delete {path} to resume from an "
            "earlier checkpoint")


@contextlib.contextmanager
def save_errors(run_dir: Path, target: Path) -> Iterator[None]:
    """Turn a failed write of ``target`` (disk full, unwritable directory) into one line naming what is kept: an
    OSError, or what torch.save (RuntimeError) or safetensors raise when the disk fills (files.disk_full)."""
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
    with save_errors(run_dir, path), atomic_path(path, is_dir=True) as tmp:
        write_state(state, tmp / STATE_FILE)
        write_checksums(tmp)  # verified by load_checkpoint: a flipped bit is never resumed from
        event(f"checkpoint-writing {update}")  # written, not yet in place: a kill here leaves only a temporary
    for old in list_checkpoints(run_dir)[:-keep]:  # only after the new one is complete
        shutil.rmtree(old, ignore_errors=True)
    return path


def load_checkpoint(path: Path, expect: tuple[str, ...] = (), quiet: bool = False) -> dict:
    """Read a checkpoint written by `save_checkpoint`, its checksums verified; a corrupt one, or a file that is not a
    checkpoint holding the keys ``expect`` (`RESUMABLE` for a run's), is one line naming what to fall back to. One
    without checksums loads with a warning on stderr (unless ``quiet``: the processes other than 0)."""
    if not verify_checksums(path) and not quiet:
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
    check_same_run(checkpoint["config"], identity)
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


# ----------------------------------------------------------------------------------------------- background saves
def copy_state(state: Any, into: Any = None, _copies: dict | None = None) -> Any:
    """``state`` with every tensor copied to CPU memory: what a thread can write while training changes the original.

    A tensor is copied into ``into``'s tensor at the same place when shape and dtype match (the previous save's copy,
    so no fresh memory is taken per save); tensors that share memory (tied weights) are copied once and stay shared;
    containers are rebuilt, other values deep-copied.
    """
    copies = {} if _copies is None else _copies
    if torch.is_tensor(state):
        key = (state.untyped_storage().data_ptr(), state.storage_offset(), state.shape, state.stride(), state.dtype)
        if key not in copies:
            reuse = torch.is_tensor(into) and into.shape == state.shape and into.dtype == state.dtype
            if not reuse:  # page-locked memory for a GPU tensor: the copy is then a DMA transfer
                into = torch.empty(state.shape, dtype=state.dtype, pin_memory=state.is_cuda)
            copies[key] = into.copy_(state.detach())
        return copies[key]
    if isinstance(state, Mapping):
        old = into if isinstance(into, Mapping) else {}
        return {k: copy_state(v, old.get(k), copies) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        old = into if isinstance(into, (list, tuple)) and len(into) == len(state) else [None] * len(state)
        return type(state)(copy_state(v, o, copies) for v, o in zip(state, old))
    return copy.deepcopy(state)


def cpu_copy(module: nn.Module) -> nn.Module:
    """A copy of ``module`` in CPU memory, without gradients: the model a background save writes."""
    clone = copy.deepcopy(module).requires_grad_(False)
    for p in clone.parameters():
        p.grad = None
    return clone.to("cpu")


class BackgroundSaver:
    """Writes training checkpoints in a thread, which first copies the state to CPU memory; the training loop goes on.

    `save` takes the state (`training_state`: live references to the weights and the optimizer's moments, snapshots
    of everything else) and returns at once; the thread copies the tensors (on a GPU: on a stream of its own, into
    page-locked memory), then writes. The loop may run whatever only reads the weights (the next update's rollout)
    and must call `wait_copied` before anything changes them (the optimizer's first step). One write at a time:
    `save` first waits for the write before it. A write that fails (a full disk) leaves the checkpoint before it
    as the last good one, and its one-line error is raised on the main thread by the next `check`, `save` or `wait`.
    ``models`` (name -> module): their saved directories are written from CPU copies whose tensors are the copied
    ``objects[name]`` state (`save`'s ``write_models`` receives the copies).
    """

    def __init__(self, run_dir: Path, keep: int, models: Mapping[str, nn.Module] | None = None):
        self.run_dir, self.keep = Path(run_dir), keep
        self.models = {name: cpu_copy(module) for name, module in (models or {}).items()}
        # the first copy of the state lands in the model copies' own tensors (tied weights stay tied)
        self._state: Any = {"objects": {name: module.state_dict() for name, module in self.models.items()}}
        self._thread: threading.Thread | None = None
        self._copied = threading.Event()
        self._copied.set()
        self._error: BaseException | None = None

    def save(self, update: int, state: dict,
             write_models: Callable[[Mapping[str, nn.Module]], None] | None = None) -> Path:
        """Copy ``state`` (`training_state`) to CPU memory and write it, in a thread, as the checkpoint after
        ``update`` updates, followed by ``write_models(copies)``; -> the checkpoint's path once written."""
        self.wait()
        # a GPU's pending work (the last optimizer step) must finish before the thread's stream reads the weights
        ready = ((torch.cuda.current_device(), torch.cuda.current_stream().record_event())
                 if torch.cuda.is_initialized() else None)
        self._copied.clear()
        self._thread = threading.Thread(target=self._write, args=(update, state, write_models, ready),
                                        name="checkpoint-writer")
        self._thread.start()
        return checkpoint_dir(self.run_dir, update)

    def wait_copied(self) -> None:
        """Wait until the last save's state is in CPU memory: call it before anything changes the saved tensors.

        A copy or write that failed is not raised here, inside an update where the other torchrun processes may wait
        in a collective, but at the update's end (`check`, `error`: run.py shares it with every process)."""
        self._copied.wait()

    def _copy(self, state: dict, ready: tuple[int, torch.cuda.Event] | None) -> None:
        """The thread's first job: ``state``'s tensors into the CPU copies (on a GPU, on a stream of its own)."""
        if ready is None:
            self._state = copy_state(state, self._state)
            return
        device, event = ready
        with torch.cuda.device(device):  # a new thread's current device is 0: the training process's GPU here
            stream = torch.cuda.Stream()
            stream.wait_event(event)
            with torch.cuda.stream(stream):
                self._state = copy_state(state, self._state)
            stream.synchronize()

    def _write(self, update: int, state: dict, write_models: Callable[[Mapping[str, nn.Module]], None] | None,
               ready: tuple[int, torch.cuda.Event] | None) -> None:
        try:
            try:
                self._copy(state, ready)
            finally:
                self._copied.set()  # the loop goes on (a failed copy is raised at the update's end)
            save_checkpoint(self.run_dir, update, self._state, self.keep)  # the checkpoint first: it resumes a run
            if write_models is not None:
                write_models(self.models)
        except BaseException as e:  # the main thread raises it (check / wait)
            self._error = e

    @property
    def error(self) -> BaseException | None:
        """The error of a write that failed, without raising it or waiting for one still under way."""
        return self._error

    def check(self) -> None:
        """Raise the error of a write that failed, without waiting for one still under way."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def wait(self) -> None:
        """Wait for the write under way, then `check`."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.check()

    def wait_quietly(self) -> None:
        """Wait for the write under way and drop its error: when the training loop fails, its own error is the one to
        show, and the checkpoint before stays the last good one."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._error = None
