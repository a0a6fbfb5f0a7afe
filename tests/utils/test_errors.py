"""utils/errors.py: each way a process ends is one line and its exit status, said once under torchrun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_only_process_0_prints_the_error(monkeypatch, capsys):
    from lm_human_preference_details.utils import errors

    def fail():
        raise errors.UserError("--ppo.lr is -1.0")

    monkeypatch.setattr(errors, "OTHER_RANKS_WAIT_S", 0.0)
    for rank, expected in (("0", "error: --ppo.lr is -1.0\n"), ("1", "error: --ppo.lr is -1.0 (process 1)\n")):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as e:
            errors.run_main(fail)
        assert e.value.code == 2 and capsys.readouterr().err == expected


def test_a_collective_that_fails_because_a_peer_died_is_one_line(monkeypatch, capsys):
    """gloo's error when a peer was killed (kill -9) during a collective: one line, process 0's at once, no traceback;
    any other unexpected error on process 0 is a bug and keeps its traceback."""
    from lm_human_preference_details.utils import errors

    def peer_gone():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:4242: Connection reset by peer")

    def bug():
        raise RuntimeError("a bug of ours")

    monkeypatch.setattr(errors, "OTHER_RANKS_WAIT_S", 0.0)
    for rank, where in (("0", ""), ("1", " (process 1)")):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as e:
            errors.run_main(peer_gone)
        err = capsys.readouterr().err
        assert e.value.code == 1 and err.count("\n") == 1 and err.endswith(f"continue with --resume{where}\n"), err
        assert err.startswith("error: a collective operation failed, so another process of this torchrun job died")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(RuntimeError, match="a bug of ours"):
        errors.run_main(bug)


LATE_SIGTERM = """
import atexit, os, signal, sys
from lm_human_preference_details.utils.errors import run_main
from lm_human_preference_details.utils.errors import Stopped

def torchrun_stopping_a_process_still_leaving():
    signal.raise_signal(signal.SIGTERM)  # handled before the next line
    print("left on its own", flush=True)

def main():
    raise Stopped("stopped by SIGUSR1 after update 0; saved RUN/checkpoints/update_00000001", signal.SIGUSR1)

atexit.register(torchrun_stopping_a_process_still_leaving)
run_main(main)
"""


def test_an_agreed_stop_ends_every_process_alike_whatever_torchrun_sends_then():
    """Every process stopped after the same update: process 0 says it, all exit 128 + the signal at once, and torchrun's
    SIGTERM to those still leaving (sent when the first has exited) changes neither the line nor the status."""

    for rank, err in (("0", "error: stopped by SIGUSR1 after update 0; saved RUN/checkpoints/update_00000001\n"),
                      ("1", "")):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "WORLD_SIZE": "2", "RANK": rank}
        result = subprocess.run([sys.executable, "-c", LATE_SIGTERM], capture_output=True, text=True, env=env, cwd=ROOT,
                                timeout=300)
        assert (result.returncode, result.stdout, result.stderr) == (128 + signal.SIGUSR1, "left on its own\n", err)


def _ended(main, monkeypatch, capsys, rank: str = "0") -> tuple[int, str]:
    """run_main(main) on process ``rank`` of a 2-process job -> (exit status, what it printed on stderr)."""
    from lm_human_preference_details.utils import errors

    monkeypatch.setattr(errors, "OTHER_RANKS_WAIT_S", 0.0)
    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as e:
        errors.run_main(main)
    return e.value.code, capsys.readouterr().err


def _raise(error: BaseException):
    def main():
        raise error

    return main


def test_each_way_a_process_ends_has_its_line_and_status(monkeypatch, capsys):
    """The module's table, by hand: a user's error 2, a stop 128 + its signal, an agreed failure its own status with
    nothing more said (process 0 printed it when the processes agreed), an interruption 128 + its signal, a full disk 2."""
    import errno

    from lm_human_preference_details.utils.errors import Interrupted, JobFailed, Stopped, UserError

    stop = Stopped("stopped by SIGUSR1 after update 3; saved RUN/checkpoints/update_00000004", signal.SIGUSR1)
    full = OSError(errno.ENOSPC, "No space left on device")
    cases = [(UserError("--lr is -1.0"), 2, "error: --lr is -1.0\n"),
             (stop, 128 + signal.SIGUSR1, f"error: {stop}\n"),
             (JobFailed("error: --x (process 1)", 3), 3, ""),
             (Interrupted(signal.SIGTERM), 128 + signal.SIGTERM, "error: interrupted by SIGTERM; nothing half-written"),
             (full, 2, "error: the disk is full (")]
    previous = signal.getsignal(signal.SIGTERM)
    try:
        for error, status, line in cases:
            code, err = _ended(_raise(error), monkeypatch, capsys)
            assert code == status and err.startswith(line) and err.count("\n") == (1 if line else 0), (error, code, err)
    finally:
        signal.signal(signal.SIGTERM, previous)  # an agreed stop ignores torchrun's late signals from here on


def test_a_stop_and_an_agreed_failure_are_said_by_process_0_alone(monkeypatch, capsys):
    from lm_human_preference_details.utils.errors import JobFailed, Stopped

    previous = signal.getsignal(signal.SIGTERM)
    try:
        assert _ended(_raise(Stopped("stopped by SIGTERM after update 0", signal.SIGTERM)), monkeypatch, capsys,
                      rank="1") == (128 + signal.SIGTERM, "")
        assert _ended(_raise(JobFailed("error: x", 2)), monkeypatch, capsys, rank="1") == (2, "")
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_an_interruption_names_the_step_under_way(monkeypatch, capsys):
    from lm_human_preference_details.utils.errors import Interrupted, doing

    def main():
        with doing("building the offline task's assets"), doing("unpacking the model"):
            raise Interrupted(signal.SIGTERM)

    code, err = _ended(main, monkeypatch, capsys)
    assert code == 128 + signal.SIGTERM and err.startswith("error: interrupted by SIGTERM while unpacking the model;")
