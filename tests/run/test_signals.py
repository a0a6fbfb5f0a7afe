"""run/signals.py: a stop or a death on a cluster, with two torchrun launchers on localhost (c10d rendezvous, gloo on the CPU),
one worker each, as two nodes run a job. A signal to the launchers goes to the real command line (what Slurm and
`docker stop` signal); a signal to one worker goes to a job of two torchrun agents forked from the test
(helpers.processes.ForkedAgent: the same agent, rendezvous and report, without four interpreters' imports).

Every case halts both workers at their first update (the LMHP_TEST_EVENTS hook: each stops itself with SIGSTOP), then
signals or kills while they stand still, and lets them go on: the stop or death lands at a known point, never after a
guessed time. The job must end with one `error:` line in all, no traceback through our files, every process gone
within a bound far above what it takes here (measured: docs/ranks.md, "On a cluster").
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers.events import events_env
from helpers.processes import ForkedAgent, differing, free_port, in_process
from helpers.runs import assert_same_run
from helpers.site.lmhp_events import PIDS

ROOT = Path(__file__).resolve().parents[2]
BOUND_S = 120  # from the signal to the last launcher's exit; measured 3.2-6.8 s on the shared 2-core VM (docs/ranks.md)


def policy_args(assets, reward_model, run_dir) -> list:
    """2 PPO updates of the tiny model (a stop after update 0 leaves one to resume), 4 episodes on 2 ranks, --exact-ranks
    (1 and 2 processes give the same run); responses of 2 tokens (each costs the 50257-token head; the stops land
    between updates whatever their sizes)."""
    return ["--base-model", assets / "tiny-gpt2", "--rewards.trained-model", reward_model,
            "--task.query-dataset", assets / "queries.txt", "--task.response-length", 2, "--task.truncate-after", 1,
            "--ppo.total-episodes", 8, "--ppo.batch-size", 4,
            "--ppo.nminibatches", 1, "--ppo.noptepochs", 1, "--ppo.no-whiten-rewards", "--num-ranks", 2,
            "--device", "cpu", "--exact-ranks", "--output-dir", run_dir]


def environment(**extra) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled",
            "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", **extra}


def two_launchers(args: list, tmp_path: Path, env: dict, forked: bool) -> tuple[list, list[Path]]:
    """Two `torchrun --nnodes 2 --nproc-per-node 1` on localhost, joined by c10d, as real processes or ``forked``
    (helpers.processes.ForkedAgent); their output goes to files."""
    options = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"127.0.0.1:{free_port()}", "--rdzv-id", "cluster", "--monitor-interval", "0.1"]
    argv = [str(ROOT / "train_policy.py"), *map(str, args)]
    logs = [tmp_path / f"launcher{i}.log" for i in range(2)]
    if forked:
        return [ForkedAgent(options, argv, log, env_extra=differing(env)) for log in logs], logs
    command = [sys.executable, "-m", "torch.distributed.run", *options, *argv]
    launchers = [subprocess.Popen(command, stdout=open(log, "w"), stderr=subprocess.STDOUT, cwd=ROOT, env=env)
                 for log in logs]
    return launchers, logs


def wait_for(condition, what: str, timeout: float = 600):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def stat_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def pending(pid: int, signum: int) -> bool:
    """Whether ``signum`` waits for process ``pid`` (stopped, it cannot take it yet)."""
    status = Path(f"/proc/{pid}/status").read_text()
    masks = re.findall(r"^(?:ShdPnd|SigPnd):\s*([0-9a-f]+)", status, re.M)
    return any(int(m, 16) >> (signum - 1) & 1 for m in masks)


def halted_at_first_update(events: Path, named: Path) -> dict[str, int]:
    """Wait until both workers stand still at update 0 (the events hook, which writes each one's RANK and pid to
    ``named``); -> {rank: pid}."""
    wait_for(lambda: events.exists() and events.read_text().count("update 0") == 2, "both workers at update 0")
    pids = dict(line.split() for line in named.read_text().splitlines())
    wait_for(lambda: all(stat_state(int(p)) == "T" for p in pids.values()), "both workers stopped")
    return {rank: int(pid) for rank, pid in pids.items()}


def go_on_until_exit(launchers, pids) -> float:
    """Continue the workers (again at each later event, e.g. the checkpoint writer's) until both launchers have
    exited; -> seconds from the first continue to the last exit."""
    start = time.monotonic()
    while any(launcher.poll() is None for launcher in launchers):
        assert time.monotonic() - start < BOUND_S, "the job did not end within the bound"
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return time.monotonic() - start


def job_output(logs) -> str:
    return "".join(log.read_text() for log in logs)


def assert_one_line(out: str, match: str) -> None:
    """One `error:` line in the whole job's output, naming ``match``; no traceback through our files."""
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and match in errors[0], out[-4000:]
    assert "terminate called" not in out, out[-4000:]  # no process died of SIGABRT on its way out (docs/ranks.md)
    ours = re.findall(r'File "[^"]*(?:lm_human_preference_details/|train_policy\.py|train_reward\.py)', out)
    assert not ours and "[rank0]: Traceback" not in out, out[-4000:]


def worker_exit_codes(out: str) -> list[int]:
    """The workers' exit statuses as their launchers log them (a launcher whose c10d store went with the other
    launcher may end without its failure report)."""
    return sorted(int(c) for c in re.findall(r"failed \(exitcode: (-?\d+)\) local_rank: 0 ", out))


def checkpoints(run_dir: Path) -> list[str]:
    return sorted(p.name for p in (run_dir / "checkpoints").glob("update_*"))


def stopped_job(assets, reward_model, tmp_path, run_dir, signal_to, forked: bool = False) -> tuple[str, float]:
    """A two-launcher run (real, or ``forked``) halted at update 0, ``signal_to(launchers, {rank: pid})`` then, and let
    go on until it ends; -> (the job's output, seconds from the signal to the last exit)."""
    events, named = tmp_path / "events", tmp_path / "events.pids"
    env = events_env(events, environment(**{PIDS: str(named)}))
    launchers, logs = two_launchers(policy_args(assets, reward_model, run_dir), tmp_path, env, forked)
    pids: dict[str, int] = {}
    try:
        pids = halted_at_first_update(events, named)
        signal_to(launchers, pids)
        seconds = go_on_until_exit(launchers, pids.values())
    finally:  # after a failure: nothing left behind, least of all a worker stopped for good
        for process in [*pids.values(), *(launcher.pid for launcher in launchers if launcher.poll() is None)]:
            try:
                os.kill(process, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for launcher in launchers:
            launcher.wait()
    return job_output(logs), seconds


def test_sigterm_to_both_launchers_stops_every_process_after_one_update_and_resume_continues_the_same_run(
        assets, reward_model, tmp_path):
    """As Slurm or `docker stop` stop a job: SIGTERM to each node's torchrun, which passes it on to its workers. The
    resume and the uninterrupted run to compare with are 1-process runs in this process (helpers.processes.in_process): the
    stopped job is the torchrun run here, and a resume on another process count is --exact-ranks' promise."""
    def terminate_launchers(launchers, pids):
        for launcher in launchers:
            launcher.send_signal(signal.SIGTERM)
        wait_for(lambda: all(pending(p, signal.SIGTERM) for p in pids.values()), "torchrun passing SIGTERM on", 60)

    run_dir = tmp_path / "run"
    out, seconds = stopped_job(assets, reward_model, tmp_path, run_dir, terminate_launchers)
    print(f"SIGTERM to both launchers: the job ended {seconds:.1f} s after the workers went on")
    assert_one_line(out, "stopped by SIGTERM after update 0; saved")
    assert "forcefully exiting" not in out, out[-4000:]  # every worker left on its own, within torchrun's grace
    assert checkpoints(run_dir) == ["update_00000001"]

    resumed = in_process("train_policy.py", *policy_args(assets, reward_model, run_dir), "--resume")
    assert f"resume: continuing from {run_dir / 'checkpoints' / 'update_00000001'}" in resumed.stdout, resumed.stdout
    in_process("train_policy.py", *policy_args(assets, reward_model, tmp_path / "whole"))
    assert_same_run(tmp_path / "whole", run_dir, "policy")


def test_sigterm_to_one_worker_stops_every_process_after_the_same_update(assets, reward_model, tmp_path):
    """A signal that reaches process 1 alone (Slurm signalling one node's step) is every process's stop."""
    run_dir = tmp_path / "run"
    out, seconds = stopped_job(assets, reward_model, tmp_path, run_dir,
                               lambda launchers, pids: os.kill(pids["1"], signal.SIGTERM), forked=True)
    print(f"SIGTERM to process 1: the job ended {seconds:.1f} s after the workers went on")
    assert_one_line(out, "stopped by SIGTERM after update 0; saved")
    assert set(worker_exit_codes(out)) == {143}, out[-4000:]  # the same status, none killed by torchrun's SIGTERM
    assert checkpoints(run_dir) == ["update_00000001"]


def test_a_worker_killed_outright_ends_the_job_with_one_line(assets, reward_model, tmp_path):
    """kill -9 of process 1 mid-PPO: process 0's next collective fails; it says so in one line, no traceback."""
    run_dir = tmp_path / "run"
    out, seconds = stopped_job(assets, reward_model, tmp_path, run_dir,
                               lambda launchers, pids: os.kill(pids["1"], signal.SIGKILL), forked=True)
    print(f"kill -9 of process 1: the job ended {seconds:.1f} s after process 0 went on")
    assert_one_line(out, "another process of this torchrun job died or left")
    assert "continue with --resume" in out and -9 in worker_exit_codes(out), out[-4000:]
    assert not checkpoints(run_dir)
