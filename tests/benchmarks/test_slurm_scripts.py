"""benchmarks/slurm_*.sbatch stop before the time limit, requeue themselves and come back with --resume.

No Slurm here: the scripts run under bash with stand-ins for srun (runs its command here), scontrol (one host name;
records a requeue) and python (records its arguments, then trains until a signal, or ends at once)."""

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [ROOT / "benchmarks" / "slurm_torchrun.sbatch", ROOT / "benchmarks" / "slurm_array.sbatch"]

STAND_INS = {
    "srun": '#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n',
    "scontrol": '#!/bin/bash\nif [[ $1 == show ]]; then echo node7; else echo "$*" >> "$FAKE_DIR/scontrol"; fi\n',
    # the run: its arguments, then "training" until USR1 or TERM, which it takes as train_policy.py does (128 + signal)
    "python": '#!/bin/bash\nprintf "%s\\n" "$@" > "$FAKE_DIR/args"\n[[ -n $FAKE_DONE ]] && exit 0\n'
              'trap "exit 138" USR1\ntrap "exit 143" TERM\ntouch "$FAKE_DIR/training"\n'
              'while :; do sleep 0.05; done\n',
}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_scripts_ask_for_a_signal_before_the_time_limit_and_may_be_requeued(script):
    text = script.read_text()
    assert "#SBATCH --requeue" in text and "#SBATCH --signal=B:USR1@300" in text
    assert "29500" not in text
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def torchrun_job(tmp_path, **env) -> subprocess.Popen:
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for name, text in STAND_INS.items():
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{fake}{os.pathsep}{os.environ['PATH']}", "FAKE_DIR": str(tmp_path),
           "SLURM_SUBMIT_DIR": str(ROOT), "SLURM_JOB_ID": "123456", "SLURM_JOB_NODELIST": "node[7-8]",
           "SLURM_JOB_NUM_NODES": "2", "LMHP_GPUS_PER_NODE": "4", "LMHP_ARGS": "--task sentiment --seed 1", **env}
    return subprocess.Popen(["bash", str(SCRIPTS[0])], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # its own process group: the test can end it all


def signalled(job: subprocess.Popen, tmp_path: Path, signum: int) -> tuple[int, str]:
    """Send ``signum`` to the batch shell once the run trains; -> the job's status and output."""
    deadline = time.monotonic() + 60
    while not (tmp_path / "training").exists():
        assert time.monotonic() < deadline and job.poll() is None, job.stdout.read() if job.poll() is not None else ""
        time.sleep(0.05)
    job.send_signal(signum)
    try:
        out, _ = job.communicate(timeout=60)
    finally:
        try:
            os.killpg(job.pid, signal.SIGKILL)  # whatever is left of the job, e.g. a run whose shell died
        except ProcessLookupError:
            pass
    return job.returncode, out


def test_usr1_before_the_time_limit_stops_the_run_and_requeues_the_job(tmp_path):
    status, out = signalled(torchrun_job(tmp_path), tmp_path, signal.SIGUSR1)
    assert status == 138, out  # the run's own status: it stopped on USR1 after saving
    assert (tmp_path / "scontrol").read_text() == "requeue 123456\n"
    args = (tmp_path / "args").read_text().splitlines()
    assert args[args.index("--rdzv-endpoint") + 1] == f"node7:{20000 + 123456 % 20000}"
    assert "SIGUSR1" in args[args.index("--signals-to-handle") + 1].split(",")
    assert args[-4:] == ["--task", "sentiment", "--seed", "1"]  # a first start: no --resume


def test_sigterm_stops_the_run_without_a_requeue(tmp_path):
    """scancel or a preemption: the run stops and saves; Slurm, not the script, decides whether the job comes back."""
    status, out = signalled(torchrun_job(tmp_path), tmp_path, signal.SIGTERM)
    assert status == 143, out
    assert not (tmp_path / "scontrol").exists()


def test_a_requeued_job_continues_its_run_with_resume(tmp_path):
    job = torchrun_job(tmp_path, SLURM_RESTART_COUNT="1", FAKE_DONE="1")
    out, _ = job.communicate(timeout=60)
    assert job.returncode == 0, out
    assert (tmp_path / "args").read_text().splitlines()[-5:] == ["--task", "sentiment", "--seed", "1", "--resume"]
    assert re.search(r"rendezvous at node7:\d+, start 1", out) and not (tmp_path / "scontrol").exists()
