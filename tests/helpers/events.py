"""Stopping a run a test started at exactly one point: its audit events (`utils.progress.passed`) and `drive`."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Callable

from helpers.site.lmhp_events import EVENTS

SITE = Path(__file__).resolve().parent / "site"


def events_env(events: Path, env: dict | None = None) -> dict[str, str]:
    """``env`` (default: this process's) for a run that appends its events to ``events`` and stops at each: the hook
    comes with helpers/site on its PYTHONPATH."""
    env = dict(os.environ if env is None else env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SITE), env.get("PYTHONPATH", "")) if p)
    env[EVENTS] = str(events)
    return env


def drive(pid: int, events: Path, act: Callable[[str], None] = lambda event: None) -> tuple[int, list[str]]:
    """Follow a child run started with `events_env(events)`: each time it stops at an event, call ``act(event)`` (which
    may signal it: SIGKILL, SIGTERM), then continue it, until it ends.

    -> (its exit code as subprocess gives it: -9 when killed, 128 + signal after a stop, ...; its events in order).
    A failure here (in ``act`` too) kills the child first: no run is left stopped behind a failed test.
    """
    seen: list[str] = []
    try:
        while True:
            _, status = os.waitpid(pid, os.WUNTRACED)
            if not os.WIFSTOPPED(status):
                return os.waitstatus_to_exitcode(status), seen
            new = events.read_text().splitlines()[len(seen):] if events.exists() else []
            seen += new
            for event in new:
                act(event)
            os.kill(pid, signal.SIGCONT)
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise
