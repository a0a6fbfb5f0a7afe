"""Agreeing on a failure across a torchrun job: every process says whether it failed at the same point, and if any did,
all raise together with one line from process 0 (docs/ranks.md, "When a process fails"). Nobody is left waiting in a
collective for a process that has gone. `Ranks` takes these methods; rank geometry and collectives are its own.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch.distributed as dist

from lm_human_preference_details.utils.errors import JobFailed, error_line


class AgreeOnFailures:
    """The decisions that end a run, for every process of the job at once; needs ``world_size`` and ``is_main``."""

    world_size: int  # both given by the class that takes these methods (Ranks)
    is_main: bool

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
