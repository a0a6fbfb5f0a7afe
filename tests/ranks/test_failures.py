"""ranks/failures.py: a failure on one torchrun process is the job's failure (2 gloo processes on the CPU).

Each case fails on process 0 alone while process 1 goes on to the next collective. The job must end with process 0's
one `error:` line, printed once, no traceback from our code, and process 1 stopped by torchrun (SIGTERM, once
process 0 has ended) rather than leaving on its own after its 10 s wait (`errors.leave_quietly`), or hanging.

One case runs the real command line (`python -m torch.distributed.run`): what a user's terminal shows. The cases that
inject a failure run as torchrun's agent runs them, with its agent and workers forks of this process
(helpers.processes.started): the same agent, rendezvous and report, without three interpreters' imports (~19 CPU s a
job here) for what each adds, its point of failure. A failure is injected by a script run first in each worker
(INJECT): it patches one function of the package in process 0 only (RANK 0), then runs train_policy.py as its
``__main__``, so the code under test is the script's own.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.processes import EXITS, exit_statuses, started

from lm_human_preference_details.run.directory import LOCK, MARKER

ROOT = Path(__file__).resolve().parents[2]
# python INJECT WHAT SCRIPT ARGS: WHAT broken on process 0, then `python SCRIPT ARGS`
INJECT = '''
import errno, os, runpy, sys

what = sys.argv[1]
if os.environ["RANK"] == "0":
    if what == "main_first":  # any exception on process 0 inside main_first (the run-directory checks)
        import lm_human_preference_details.run.directory as run_dir

        def broken(*args, **kwargs):
            raise RuntimeError("injected on process 0")
        run_dir.check_run_dir = broken
    elif what == "disk_full":  # every checkpoint write fails on process 0 (root ignores read-only modes)
        import lm_human_preference_details.run.checkpoint as checkpoint

        def full(state, path):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        checkpoint.write_state = full
    elif what == "tracker":  # the metrics file cannot be written on process 0 (a full disk)
        import lm_human_preference_details.run.tracking as tracking

        def full_log(self, metrics, step):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        tracking.Tracker.log = full_log
    else:
        raise ValueError(what)
sys.argv = sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def policy_args(assets, reward_model, run_dir, *extra) -> list:
    """2 PPO updates (process 1 has a next update to go on to) of 4 episodes, one rank per process, 2-token responses.
    The failures come at update 0's log or save whatever the sizes."""
    return ["--base-model", assets / "tiny-gpt2", "--rewards.trained-model", reward_model,
            "--task.query-dataset", assets / "queries.txt", "--task.response-length", 2, "--task.truncate-after", 1,
            "--ppo.total-episodes", 8, "--ppo.batch-size", 4, "--ppo.nminibatches", 1, "--ppo.noptepochs", 1,
            "--ppo.no-whiten-rewards", "--num-ranks", 2, "--device", "cpu",
            "--save-interval", 1, "--output-dir", run_dir, *extra]


def torchrun_policy(assets, reward_model, run_dir, *extra) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run --standalone --nproc-per-node 2 train_policy.py` (gloo), as a user types it:
    its 3 interpreters' imports and model loads are what the job costs."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
           "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(ROOT / "train_policy.py"), *map(str, policy_args(assets, reward_model, run_dir, *extra))],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def injected_policy(assets, reward_model, tmp_path, run_dir, inject: str) -> tuple[subprocess.CompletedProcess, dict]:
    """train_policy.py under torchrun's agent, 2 processes, with ``inject`` broken on process 0 (INJECT) -> (the job's
    output, {rank: its exit status})."""
    (tmp_path / "inject.py").write_text(INJECT)
    exits = tmp_path / "exits"
    job = started(tmp_path / "inject.py", 2, inject, ROOT / "train_policy.py", *policy_args(assets, reward_model, run_dir),
                  env_extra={EXITS: exits}, check=False)
    return job(), exit_statuses(exits)


def assert_job_failed_together(proc: subprocess.CompletedProcess, match: str, exits: dict | None = None) -> None:
    """One `error:` line naming ``match``; no traceback through our files; process 1 stopped by torchrun's SIGTERM:
    the statuses in torchrun's report, or in ``exits`` ({rank: status}, as the forked workers recorded them)."""
    out = proc.stdout + proc.stderr
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0, out[-3000:]
    assert len(errors) == 1 and match in errors[0], out[-3000:]
    ours = re.findall(r'File "[^"]*(?:lm_human_preference_details/|train_policy\.py|train_reward\.py)', out)
    assert not ours, out[-3000:]  # torchrun's own ChildFailedError report is the only traceback
    # process 0 fails first with our exit status; process 1, waiting quietly, is ended by torchrun (not by its timer)
    if exits is not None:
        assert exits.get(0) in (1, 2) and exits.get(1) == 143, (exits, out[-3000:])  # a killed one is missing
        return
    assert re.search(r"rank\s*:\s*0 \(local_rank: 0\)\s*\n\s*exitcode\s*:\s*[12] ", out), out[-3000:]
    assert re.search(r"rank\s*:\s*1 \(local_rank: 1\)\s*\n\s*exitcode\s*:\s*143 ", out), out[-3000:]


def existing_policy_run(path: Path) -> Path:
    """A finished policy run's directory as the scripts leave it (its marker and logs)."""
    path.mkdir(parents=True)
    (path / MARKER).write_text(json.dumps({"kind": "policy", "id": "x"}))
    (path / "metrics.jsonl").write_text('{"step": 0}\n')
    return path


def test_a_directory_held_by_a_live_run(assets, reward_model, tmp_path):
    """A refusal by the run directory's checks (here its lock; the same path for a rerun without --resume or a run of
    the other kind, each checked on one process by tests/run/test_directory.py) ends the job in one line and leaves the
    run as it was."""
    run_dir = existing_policy_run(tmp_path / "run")
    with open(run_dir / LOCK, "w") as held:  # a live run holds the lock
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        proc = torchrun_policy(assets, reward_model, run_dir, "--resume")
    assert_job_failed_together(proc, "is in use by a live run")
    assert (run_dir / "metrics.jsonl").read_text() == '{"step": 0}\n'


def test_a_checkpoint_write_that_fails_on_process_0(assets, reward_model, tmp_path):
    proc, exits = injected_policy(assets, reward_model, tmp_path, tmp_path / "run", "disk_full")
    assert_job_failed_together(proc, f"cannot save {tmp_path / 'run' / 'checkpoints'}", exits)
    assert os.strerror(errno.ENOSPC) in proc.stderr
    assert not (tmp_path / "run" / "policy").exists()  # the models are written after the checkpoint, which failed


def test_a_tracker_write_that_fails_on_process_0(assets, reward_model, tmp_path):
    """Process 0's log fails inside the update while process 1 goes on to the next update's collectives."""
    proc, exits = injected_policy(assets, reward_model, tmp_path, tmp_path / "run", "tracker")
    assert_job_failed_together(proc, f"error: unexpected OSError: [Errno {errno.ENOSPC}]", exits)
    assert not list((tmp_path / "run" / "checkpoints").glob("update_*"))  # it stopped at update 0, before saving


def test_any_exception_on_process_0_inside_main_first(assets, reward_model, tmp_path):
    proc, exits = injected_policy(assets, reward_model, tmp_path, tmp_path / "run", "main_first")
    assert_job_failed_together(proc, "error: unexpected RuntimeError: injected on process 0", exits)


def test_an_agreed_failure_is_the_first_failed_processs_line_said_by_process_0(monkeypatch, capsys):
    """failures.agree_on with 3 processes, the collective stood in for: the line of the first process that failed,
    named when it is not process 0, printed by process 0 alone; every process raises JobFailed with its own status."""
    from lm_human_preference_details.ranks import failures
    from lm_human_preference_details.utils.errors import JobFailed, UserError

    class Job(failures.AgreeOnFailures):
        world_size = 3

        def __init__(self, is_main):
            self.is_main = is_main

    for gathered, line in ((["error: a", "error: b", None], "error: a"),
                           ([None, "error: b", "error: c"], "error: b (process 1)")):
        monkeypatch.setattr(failures.dist, "all_gather_object", lambda out, mine, g=gathered: out.__setitem__(
            slice(None), g))
        for is_main, error, code in ((True, None, 1), (False, UserError("--x"), 2)):
            with pytest.raises(JobFailed) as e:
                Job(is_main).agree_on(error)
            assert (str(e.value), e.value.exit_code, capsys.readouterr().err) == (line, code, line + "\n" if is_main
                                                                                  else "")
    monkeypatch.setattr(failures.dist, "all_gather_object", lambda out, mine: out.__setitem__(slice(None), [None] * 3))
    Job(True).agree_on(None)  # nobody failed: nothing said, nothing raised
    assert capsys.readouterr().err == ""


def test_the_forked_agents_rendezvous_names_its_events_as_torchs_own():
    """helpers.processes.frame_function_name, which the forked agents' c10d rendezvous calls instead of torch's
    get_method_name, gives the names torch's gives, at each depth (and past the stack's end)."""
    from helpers.processes import frame_function_name
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous

    def outer():
        return inner()

    def inner():
        names = []
        for depth in (1, 2, 3, 10_000):
            names.append((dynamic_rendezvous.get_method_name(depth), frame_function_name(depth)))
        return names

    names = outer()
    this = "test_the_forked_agents_rendezvous_names_its_events_as_torchs_own"
    assert [ours for _, ours in names] == ["inner", "outer", this, "no_method_name"]
    assert all(theirs == ours for theirs, ours in names)
