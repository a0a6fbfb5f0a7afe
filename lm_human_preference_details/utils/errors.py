"""How a process ends, and with which line and exit status: the one place that decides it.

    UserError     a problem the user can fix: one `error:` line (process 0's, under torchrun), exit 2
    JobFailed     a torchrun job's failure that every process agreed on: process 0 printed its line; its status
    Stopped       a stop after an update (SIGTERM, SIGINT, SIGUSR1) that every process agreed on: exit 128 + signal
    Interrupted   SIGTERM or SIGUSR1 outside a training loop, ended at once like Ctrl-C: exit 128 + signal
    a peer's death  a collective that fails because another process died or left: exit 1
    a full disk   at any write: one line, exit 2
    anything else a bug: its traceback (process 0), exit 1

`run_main` wraps both scripts' and the commands' main and turns each into its line and status.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import time
from typing import Callable, Iterator

from lm_human_preference_details.utils.torchrun import torchrun_rank, torchrun_world

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
# how a full disk reads where no errno comes with it: the C library's words (safetensors' SafetensorError quotes them),
# and torch.save's RuntimeError (its zip writer checks how far a write got: "unexpected pos N vs M", "PytorchStreamWriter
# failed writing file ...")
FULL_MESSAGES = (*map(os.strerror, FULL_ERRNOS), "unexpected pos", "file write failed")


def disk_full(error: BaseException) -> bool:
    """Whether ``error`` says a write failed for want of space, whatever its class (OSError, torch's RuntimeError,
    safetensors' SafetensorError): an OSError by its errno, any other exception by its message."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno in FULL_ERRNOS
    return isinstance(error, Exception) and any(m in str(error) for m in FULL_MESSAGES)


class UserError(Exception):
    """A problem the user can fix: printed as one line ("error: ..."), exit status 2."""

    exit_code = 2


class JobFailed(Exception):
    """A torchrun job's failure, agreed by every process (`ranks.failures`): its one line is already printed by
    process 0; every process ends with ``exit_code``, the status of the first process that failed."""

    def __init__(self, line: str, exit_code: int):
        super().__init__(line)
        self.exit_code = exit_code


class Stopped(Exception):
    """The run stopped on SIGTERM, SIGINT or SIGUSR1 after saving what it could (`run.signals`): every process raises
    it after the same update; process 0 alone says it, and all exit at once with 128 + the signal's number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class Interrupted(BaseException):
    """SIGTERM or SIGUSR1 outside a training loop (which turns it into a stop after its update, signals.py): like Ctrl-C."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


@contextlib.contextmanager
def doing(what: str) -> Iterator[None]:
    """Name the long step under way ("building the offline task's assets"): an interruption (SIGTERM, Ctrl-C) raised
    inside it carries the name of the innermost step, which run_main's one line says."""
    try:
        yield
    except (KeyboardInterrupt, Interrupted) as e:
        if not hasattr(e, "while_doing"):
            e.while_doing = what
        raise


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)  # a stop: docker stop, Ctrl-C, Slurm's --signal=USR1@T


def run_main(main: Callable[[], object]) -> None:
    """Call ``main``; each way a process ends (the module's table) becomes one line and its exit status.

    Under torchrun every process meets the same bad input (and the same Ctrl-C), so the line comes from process 0 only
    (say_once). A failure or a stop every process agreed on is said by process 0 while every process exits at once,
    with the same status.
    """
    previous = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        main()
    except JobFailed as e:  # printed by process 0 when the processes agreed (ranks.failures)
        leave_quietly(e.exit_code)
    except Stopped as e:  # every process raised it after the same update: no one waits for process 0
        if torchrun_rank() == "0":
            print(error_line(e), file=sys.stderr, flush=True)
        previous = ignore_stop_signals(previous)
        sys.exit(e.exit_code)
    except UserError as e:
        say_once(error_line(e))
        sys.exit(e.exit_code)
    except Exception as e:  # a full disk at any write, whichever class the writer raises (disk_full)
        if disk_full(e):
            where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
            say_once(f"error: the disk is full{where} ({str(e)[:200]}); free some space and run the command again (a "
                     "run keeps its last checkpoint: continue it with --resume)")
            sys.exit(2)
        if collective_failed(e):  # a peer died (kill -9, out of memory) or left: process 0 says so at once
            say_once(f"error: a collective operation failed, so another process of this torchrun job died or left "
                     f"({_first_line(e)[:200]}); its own output or torchrun's report below names it; a run keeps its "
                     "last checkpoint: continue with --resume")
            sys.exit(1)
        if torchrun_rank() == "0":  # an unexpected error of process 0's own (a bug): its traceback, as Python shows it
            raise
        say_once(error_line(e))
        sys.exit(1)
    except (KeyboardInterrupt, Interrupted) as e:  # reaches every process of a torchrun job: process 0 says it
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        what = f" while {e.while_doing}" if hasattr(e, "while_doing") else ""
        if torchrun_rank() == "0":
            print(f"error: interrupted by {signal.Signals(signum).name}{what}; nothing half-written is kept (a run keeps "
                  "its last checkpoint: continue with --resume)", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def ignore_stop_signals(previous: dict) -> dict:
    """Under torchrun, ignore the stop signals from here to the exit (-> no handler for run_main to restore): once every
    process has agreed to end, torchrun's SIGTERM to the processes still leaving (sent as soon as the first one exits)
    must not replace the agreed line and status with another, or kill a process in the middle of leaving its group."""
    if torchrun_world()[0] == 1:
        return previous
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)
    return {}


def error_line(error: BaseException) -> str:
    """The one line a failure prints: a UserError's message, or an unexpected error's type and first line."""
    if isinstance(error, (UserError, Stopped)):
        return f"error: {error}"
    return f"error: unexpected {type(error).__name__}: {_first_line(error)}"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


# how torch.distributed's collectives fail when a peer has gone: NCCL's and the stores' own classes, gloo's RuntimeError
COLLECTIVE_ERRORS = ("DistError", "DistBackendError", "DistNetworkError", "DistStoreError")
GLOO_PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "gloo/transport")


def collective_failed(e: BaseException) -> bool:
    """Whether ``e`` is a torch.distributed collective failing because another process died or left the job."""
    if any(c.__name__ in COLLECTIVE_ERRORS for c in type(e).__mro__):
        return True
    return isinstance(e, RuntimeError) and any(marker in str(e) for marker in GLOO_PEER_GONE)


def leave_quietly(exit_code: int) -> None:
    """End a process whose job's error line is printed: process 0 at once; the others first wait (up to
    OTHER_RANKS_WAIT_S) for torchrun to stop them once process 0 has ended, so that process 0 is never stopped first."""
    if torchrun_rank() != "0":
        try:
            time.sleep(OTHER_RANKS_WAIT_S)
        except Interrupted as e:  # torchrun stopping this process once process 0 has ended: 128 + SIGTERM
            sys.exit(128 + e.signum)
    sys.exit(exit_code)


OTHER_RANKS_WAIT_S = 10.0  # how long processes 1..n-1 of a torchrun job wait for process 0 before they speak


def say_once(line: str) -> None:
    """Print a torchrun job's error ``line`` once, from process 0 (RANK), or from the only process.

    torchrun stops every process as soon as one fails. The other processes first wait OTHER_RANKS_WAIT_S for process 0
    to fail (torchrun then stops them); one still running after that met an error of its own and says it.
    """
    rank = torchrun_rank()
    if rank != "0":
        try:
            time.sleep(OTHER_RANKS_WAIT_S)
        except (KeyboardInterrupt, Interrupted):  # torchrun stopping this process once process 0 has failed
            sys.exit(1)
        line = f"{line} (process {rank})"
    print(line, file=sys.stderr, flush=True)
