"""How a process ends on a problem the user can fix: UserError, Interrupted, and run_main's one line and exit status."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from typing import Callable, Iterator

from lm_human_preference_details.files import disk_full


class UserError(Exception):
    """A problem the user can fix: printed as one line ("error: ..."), exit status 2."""


class Interrupted(BaseException):
    """SIGTERM outside a training loop (which turns it into a stop after its update, run.py): like Ctrl-C."""

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


def torchrun_rank() -> str:
    """This process's rank in a torchrun job ("0" without torchrun): only process 0 speaks for the job."""
    return os.environ.get("RANK") or "0"


def _raise_interrupted(signum: int, frame) -> None:
    raise Interrupted(signum)


def run_main(main: Callable[[], object]) -> None:
    """Call ``main``; a UserError, Ctrl-C or SIGTERM ends the process with one line and a non-zero exit.

    Under torchrun every process meets the same bad input (and the same Ctrl-C), so the line comes from process 0 only
    (say_once).
    """
    previous = signal.signal(signal.SIGTERM, _raise_interrupted)
    try:
        main()
    except UserError as e:
        if getattr(e, "said", False):  # a torchrun job's agreed failure, printed by process 0 (ranks.agree_on)
            leave_quietly(e.exit_code)
        say_once(f"error: {e}")
        sys.exit(getattr(e, "exit_code", 2))
    except Exception as e:  # a full disk at any write, whichever class the writer raises (files.disk_full)
        if disk_full(e):
            where = f" writing {e.filename}" if getattr(e, "filename", None) else ""
            say_once(f"error: the disk is full{where} ({str(e)[:200]}); free some space and run the command again (a "
                     "run keeps its last checkpoint: continue it with --resume)")
            sys.exit(2)
        if torchrun_rank() == "0":  # under torchrun, a peer's collective failing as process 0 dies: no traceback there
            raise
        say_once(f"error: {type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}")
        sys.exit(1)
    except (KeyboardInterrupt, Interrupted) as e:  # reaches every process of a torchrun job: process 0 says it
        signum = e.signum if isinstance(e, Interrupted) else signal.SIGINT
        what = f" while {e.while_doing}" if hasattr(e, "while_doing") else ""
        if torchrun_rank() == "0":
            print(f"error: interrupted by {signal.Signals(signum).name}{what}; nothing half-written is kept (a run keeps "
                  "its last checkpoint: continue with --resume)", file=sys.stderr, flush=True)
        sys.exit(128 + signum)
    finally:
        signal.signal(signal.SIGTERM, previous)


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
