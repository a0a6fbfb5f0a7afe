"""Stopping a run on a signal: while a training loop runs, SIGTERM, SIGINT and SIGUSR1 only mark a stop, the processes
agree after each update whether any received one, and all stop together after that update (`Stopped`). Outside a loop
a signal ends the process at once (errors.run_main)."""

from __future__ import annotations

import os
import signal
from typing import Any, Optional

import torch

from lm_human_preference_details.utils.errors import STOP_SIGNALS, ignore_stop_signals


class StopSignals:
    """While active, SIGTERM, SIGINT and SIGUSR1 (Slurm's --signal=USR1@T) only set ``signum``; the loop checks it at the
    end of an update. Once the processes agreed to stop (``leaving``), leaving the block ignores them under torchrun
    (errors.ignore_stop_signals) instead of restoring the previous handlers.

    A second SIGINT (Ctrl-C twice) interrupts at once, even when both arrive while the main thread is inside one long
    operation: Python then runs its handler once, so the handler counts the signals the C level wrote to a pipe.
    """

    SIGNALS = STOP_SIGNALS

    def __init__(self):
        self.signum: Optional[int] = None
        self.interrupts = 0
        self._previous: dict[int, Any] = {}
        self._pipe: Optional[tuple[int, int]] = None
        self._previous_fd = -1
        self.leaving = False

    def _handle(self, signum: int, frame) -> None:
        received = []
        if self._pipe is not None:
            try:
                received = list(os.read(self._pipe[0], 1024))
            except BlockingIOError:
                pass
        self.interrupts += max(received.count(signal.SIGINT), int(signum == signal.SIGINT))
        if self.interrupts >= 2:
            raise KeyboardInterrupt
        self.signum = self.signum or signum

    def __enter__(self) -> StopSignals:
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        try:
            self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
            self._pipe = (read, write)
        except ValueError:  # not the main thread: no pipe, one signal per handler call
            os.close(read), os.close(write)
        for s in self.SIGNALS:
            self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        previous = ignore_stop_signals(self._previous) if self.leaving else self._previous
        for s, handler in previous.items():
            signal.signal(s, handler)
        if self._pipe is not None:
            signal.set_wakeup_fd(self._previous_fd)
            for fd in self._pipe:
                os.close(fd)
            self._pipe = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""


def agree_after_update(ranks, stop: StopSignals, error: Optional[BaseException]) -> bool:
    """After each update every process learns, in one all-reduce, whether a signal reached any of them (-> True:
    all stop at this update, saving is collective; ``stop.signum`` is then the same signal on every process, the first
    of STOP_SIGNALS that reached any, so all say and exit alike) and whether process 0's tracker or checkpoint writer
    failed (``error``: then all raise it together, `Ranks.agree_on`: a write that failed ends the run now, not 50
    updates later)."""
    flags = ranks.sum(torch.tensor([float(stop.signum == s) for s in stop.SIGNALS] + [float(error is not None)]))
    if flags[-1].item() > 0:
        ranks.agree_on(error)
    received = [s for s, flag in zip(stop.SIGNALS, flags[:-1].tolist()) if flag > 0]
    if received:
        stop.signum = received[0]
    return bool(received)
