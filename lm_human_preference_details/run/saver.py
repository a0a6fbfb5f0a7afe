"""Checkpoints written in a thread from a copy in CPU memory: the training loop waits only for the copy."""

from __future__ import annotations

import copy
import threading
from pathlib import Path
from typing import Any, Callable, Mapping

import torch
from torch import nn

from lm_human_preference_details.run.checkpoint import checkpoint_dir, save_checkpoint


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
        in a collective, but at the update's end (`check`, `error`: the run shares it with every process)."""
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
