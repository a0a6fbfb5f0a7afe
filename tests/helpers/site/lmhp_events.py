"""The tests' audit hook (PEP 578) on a run's `utils.progress.passed` events: where $LMHP_TEST_EVENTS names a file, each
event is appended to it as a line and the process stops itself (SIGSTOP) until the test continues it (SIGCONT), so a
test kills, stops or races a run at exactly that point; where $LMHP_TEST_KILL_AT names an event, the process that
passes it kills itself there (SIGKILL). Installed in the test process by conftest.py and in the runs a
test starts by this folder's sitecustomize.py (on their PYTHONPATH: helpers.events.events_env)."""

import os
import signal
import sys
import time

EVENTS = "LMHP_TEST_EVENTS"
KILL_AT = "LMHP_TEST_KILL_AT"  # an event at which the process that passes it kills itself (SIGKILL): for the processes
PASSED = "lm_human_preference_details.passed"  # of a torchrun job, which are not the test's children to stop and drive
# where each process that stops at an event first appends "RANK PID" (a forked torchrun worker's RANK is in its
# os.environ alone, not in /proc/PID/environ)
PIDS = "LMHP_TEST_EVENT_PIDS"
# where set, a continued process goes on at once: for a test whose only signal at an event is SIGKILL, which no handler
# waits for (the random runs of tests/run/test_directory.py stop at ~150 events: 7 s of the pause below)
SIGKILL_ONLY = "LMHP_TEST_EVENTS_SIGKILL_ONLY"


def _hook(name: str, args: tuple) -> None:
    if name == PASSED and os.environ.get(KILL_AT) == args[0]:
        os.kill(os.getpid(), signal.SIGKILL)
    if name == PASSED and (path := os.environ.get(EVENTS)):
        if pids := os.environ.get(PIDS):
            with open(pids, "a") as f:
                f.write(f"{os.environ.get('RANK')} {os.getpid()}\n")
        with open(path, "a") as f:
            f.write(args[0] + "\n")
        os.kill(os.getpid(), signal.SIGSTOP)
        # a signal the test sent while the process stood still may be delivered to another thread as it goes on, which
        # only flags it for the main thread: a moment's sleep lets the main thread run its handler before the run reads it
        if not os.environ.get(SIGKILL_ONLY):
            time.sleep(0.05)


if not getattr(sys, "_lmhp_events_hooked", False):  # an audit hook cannot be removed: add it once per process
    sys.addaudithook(_hook)
    sys._lmhp_events_hooked = True
