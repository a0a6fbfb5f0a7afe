"""Agreeing on a failure across a torchrun job: every process says whether it failed at the same point, and if any did,
all raise together with one line from process 0 (docs/ranks.md, "When a process fails"). Nobody is left waiting in a
collective for a process that has gone. Process 0 may also work alone for a while (`main_alone`: the online
collection's labeller) while the others wait for it, a stop on any of them still seen within a second or so. `Ranks`
takes these methods; rank geometry and collectives are its own.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Callable, Iterator, Optional, TypeVar

import torch
import torch.distributed as dist

from lm_human_preference_details.utils.errors import STOP_SIGNALS, JobFailed, Stopped, error_line

T = TypeVar("T")


class AgreeOnFailures:
    """The decisions that end a run, for every process of the job at once; needs ``world_size``, ``is_main``,
    ``device`` and ``from_main``."""

    world_size: int  # given by the class that takes these methods (Ranks)
    is_main: bool
    device: torch.device
    from_main: Callable

    def agree_on(self, error: Exception | None) -> None:
        """Every process says whether it failed; if any did, all raise together (docs/ranks.md, "When a process fails").

        Call it on every process at the same point. One process alone: ``error`` is raised as it is. Under torchrun the
        errors are gathered; process 0 prints the line of the first process that failed, then every process raises
        `JobFailed` (already said): nobody is left waiting in a collective for a process that has gone.
        """
        if self.world_size == 1:
            if error is not None:
                raise error
            return
        lines: list = [None] * self.world_size
        dist.all_gather_object(lines, None if error is None else error_line(error))
        failed = [p for p, line in enumerate(lines) if line is not None]
        if not failed:
            return
        first = failed[0]
        line = lines[first] if first == 0 else f"{lines[first]} (process {first})"
        if self.is_main:
            print(line, file=sys.stderr, flush=True)  # before any shutdown step: the job's one line
        code = getattr(error, "exit_code", 1) if error is not None else 1  # a UserError's 2, a stop's 128 + signal
        raise JobFailed(line, code) from None

    @contextlib.contextmanager
    def agree(self) -> Iterator[None]:
        """Every process runs the block, then they share whether it failed anywhere (`agree_on`)."""
        error = None
        try:
            yield
        except Exception as e:  # Ctrl-C and SIGTERM reach every process: they are not caught
            error = e
        self.agree_on(error)

    @contextlib.contextmanager
    def main_first(self) -> Iterator[None]:
        """Process 0 runs the block first (e.g. checking and locking a run directory, building a cache), then the
        others (reading it); each turn ends with `agree_on`, so a failure in it ends every process at once."""
        if not self.is_main:
            self.agree_on(None)  # process 0's turn
        error = None
        try:
            yield
        except Exception as e:
            error = e
        self.agree_on(error)
        if self.is_main:
            self.agree_on(None)  # the others' turn

    def main_alone(self, work: Callable[[Callable[[], Optional[int]]], T], stop_here: Callable[[], Optional[int]]) -> T:
        """Process 0 runs ``work(stop)`` alone (talking to a labeller, for seconds or hours) while the others wait for it;
        -> its result, on every process. ``stop()`` is the stop signal any process has received (None: none; this
        process's own is ``stop_here()``): under torchrun each call is one small all-reduce with the waiting processes,
        which handle their signals between two calls, so ``work`` calls it every second or so and a stop that reached
        any process ends the wait within about that. A `Stopped` in ``work`` is raised on every process alike (its
        line, its status); any other failure is agreed (`agree_on`). One process: ``work(stop_here)``, nothing more."""
        if self.world_size == 1:
            return work(stop_here)
        result, error = None, None
        if self.is_main:
            try:
                result = work(lambda: self._poll(stop_here, done=False)[0])
            except Exception as e:  # Ctrl-C twice and a peer's death are not caught: the job ends as it would anywhere
                error = e
            self._poll(stop_here, done=True)
        else:
            while not self._poll(stop_here, done=False)[1]:  # blocks until process 0 asks again, a second at most
                pass
        stopped = self.from_main((str(error), error.exit_code - 128) if isinstance(error, Stopped) else None)
        if stopped is not None:
            raise Stopped(*stopped)
        self.agree_on(error)
        return self.from_main(result)

    def _poll(self, stop_here: Callable[[], Optional[int]], done: bool) -> tuple[Optional[int], bool]:
        """One all-reduce of which stop signals reached each process, and whether process 0's work is done ->
        (the first of STOP_SIGNALS that reached any process, or None; done)."""
        here = stop_here()
        flags = torch.tensor([float(here == s) for s in STOP_SIGNALS] + [float(done)], device=self.device)  # NCCL: GPU
        dist.all_reduce(flags)
        received = [s for s, flag in zip(STOP_SIGNALS, flags[:-1].tolist()) if flag > 0]
        return (received[0] if received else None), flags[-1].item() > 0
