"""Every process agrees where a run stands before it trains. Process 0 decides (its run directory's marker,
finished model and last checkpoint with its checksums); a process that sees another run directory (node-local disks,
or a relative --output-dir taken from each launcher's working directory) ends the job in one line, and one that sees
the same run (a shared directory, or a faithful copy) resumes from process 0's checkpoint."""

from __future__ import annotations

import hashlib
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers.processes import ForkedAgent, free_port, in_process
from helpers.runs import end_of_update

from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.run import directory as run_dir
from lm_human_preference_details.run.directory import LOCK, RunDirectory
from lm_human_preference_details.run.lifecycle import Run
from lm_human_preference_details.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def saved_run(out: Path, updates: int = 3) -> Path:
    """A policy run of a one-layer model in ``out`` that saved a checkpoint after each update (the last two kept)."""
    args = SimpleNamespace(output_dir=str(out), resume=False, overwrite=False, track=False, wandb_project="p",
                           exp_name="train_policy", first_phase=False, wandb_entity=None, task_name="t", seed=1,
                           keep_checkpoints=2, save_interval=1)
    layer = torch.nn.Linear(2, 2)
    with Run(args, "policy", inputs=[], ranks=Ranks(1, 1)) as run:
        first = run.start({"seed": 1}, {"layer": layer})
        for update in run.updates(first, updates, "policy"):
            run.log({"loss": float(update)}, step=update)
            end_of_update(run, update)
    return out


def process_0_view(out: Path) -> dict:
    """What process 0 shares after entering ``out`` with --resume."""
    directory = RunDirectory(str(out), "policy", resume=True, overwrite=False, inputs=[], say=lambda line: None)
    directory.enter()
    try:
        return directory.standing()
    finally:
        directory.lock.release()


def other_process(out: Path, stands: dict, kind: str = "policy") -> Path | None:
    """Process 1's resume point in ``out``, given process 0's view ``stands``."""
    directory = RunDirectory(str(out), kind, resume=True, overwrite=False, inputs=[], say=lambda line: None)
    return directory.resume_point(lambda seen: stands)


def digest(path: Path) -> str:
    """The names and bytes of the files below ``path``, but the run lock's (which names its holder)."""
    files = [p for p in sorted(path.rglob("*")) if p.is_file() and p.name != LOCK]
    return hashlib.sha256(b"".join(str(p).encode() + p.read_bytes() for p in files)).hexdigest()


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory) -> tuple[Path, dict]:
    """A saved run (`saved_run`) and process 0's view of it -> (its directory, the view). Shared because each run
    saves three checkpoints (~2 s); read-only: a test copies it before it changes or resumes it."""
    out = saved_run(tmp_path_factory.mktemp("cluster") / "node0")
    return out, process_0_view(out)


def test_a_process_that_sees_the_same_run_resumes_from_process_0s_checkpoint(shared_run, tmp_path):
    shared, stands = shared_run
    assert stands["checkpoint"] == "update_00000003" and stands["run"] and stands["sums"]
    copy = shutil.copytree(shared, tmp_path / "copy")  # a faithful copy on another node: the same run
    assert other_process(copy, stands) == copy / "checkpoints" / "update_00000003"


@pytest.mark.parametrize("damage, here", [
    (lambda d: shutil.rmtree(d), "here no run"),  # a node-local directory that never saw the run
    (lambda d: shutil.rmtree(d / "checkpoints" / "update_00000003"), "last checkpoint update_00000002"),  # an older copy
    (lambda d: (d / "checkpoints" / "update_00000003" / "SHA256SUMS").write_text("0  state.pt\n"), "SHA256SUMS"),
    (lambda d: (d / ".lmhp-run.json").write_text('{"kind": "policy", "id": "another"}'), "here run another"),
])
def test_a_process_that_sees_another_run_directory_ends_the_job_in_one_line(shared_run, tmp_path, monkeypatch, damage,
                                                                           here):
    monkeypatch.setattr(run_dir, "SHARED_DIR_WAIT_S", 0.2)
    node0, stands = shared_run
    node1 = shutil.copytree(node0, tmp_path / "node1")
    damage(node1)
    with pytest.raises(UserError) as e:
        other_process(node1, stands)
    message = str(e.value)
    assert "\n" not in message and here in message and f"on process 0 run {stands['run']}" in message
    assert "is not the same run directory on every process" in message and "all nodes share" in message


def test_a_process_that_sees_an_older_run_than_process_0s_new_one_ends_the_job(shared_run, tmp_path, monkeypatch):
    """The other order: process 0's node had no run (it started one), process 1's holds a saved run."""
    monkeypatch.setattr(run_dir, "SHARED_DIR_WAIT_S", 0.2)
    node1, old = shutil.copytree(shared_run[0], tmp_path / "node1"), shared_run[1]
    fresh = tmp_path / "node0"
    directory = RunDirectory(str(fresh), "policy", resume=True, overwrite=False, inputs=[], say=lambda line: None)
    directory.enter()
    stands = directory.standing()
    directory.lock.release()
    assert stands["run"] and stands["run"] != old["run"] and stands["checkpoint"] is None
    with pytest.raises(UserError, match=f"here run {old['run']}, last checkpoint update_00000003 .* on process 0 run "
                                        f"{stands['run']}, no checkpoint"):
        other_process(node1, stands)


def test_a_finished_reward_model_that_process_0_alone_sees_is_one_line(tmp_path, monkeypatch):
    """The policy's own reward run: node 1 used to fail 'RUN/reward/reward_model is not a saved reward model'."""
    monkeypatch.setattr(run_dir, "SHARED_DIR_WAIT_S", 0.2)
    stands = {"run": "abc", "finished": True, "checkpoint": None, "sums": None}
    with pytest.raises(UserError, match="here no run, on process 0 run abc, no checkpoint, a finished model"):
        other_process(tmp_path / "node1" / "reward", stands, kind="reward")


# ------------------------------------------------------------------------------ two launchers, two working directories
def test_two_launchers_in_two_working_directories_end_in_one_line(assets, reward_model, tmp_path, monkeypatch):
    """`--nnodes 2` on localhost (c10d), each launcher in its own directory with `--output-dir runs/x --resume`, after
    a run that saved in node 0's only: one error line, both launchers fail, no traceback, node 0's run untouched and
    nothing left in node 1's directory, whichever launcher c10d makes process 0. The first run, on 1 process, is made
    in this process (helpers.processes.in_process) in node 0's directory; the launchers are torchrun's agents forked
    from this process (helpers.processes.ForkedAgent), each in its working directory: what is promised is where each
    process looks, not torchrun's command line (tested on the real command in tests/ranks/test_failures.py)."""
    monkeypatch.setattr(run_dir, "SHARED_DIR_WAIT_S", 1.0)  # the view is looked at again for 1 s, not 30 (the forks')
    args = ["--base-model", assets / "tiny-gpt2", "--rewards.trained-model", reward_model,
            "--task.query-dataset", assets / "queries.txt", "--task.response-length", 4, "--task.truncate-after", 2,
            "--ppo.total-episodes", 8, "--ppo.batch-size", 4, "--ppo.nminibatches", 2, "--ppo.noptepochs", 1,
            "--ppo.no-whiten-rewards", "--num-ranks", 2, "--device", "cpu", "--save-interval", 1, "--keep-checkpoints", 2,
            "--output-dir", "runs/x", "--resume"]  # 2 updates of 4 episodes: the least that saves two checkpoints
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    node0.mkdir(), node1.mkdir()
    with monkeypatch.context() as here:
        here.chdir(node0)
        in_process("train_policy.py", *args)
    shutil.rmtree(node0 / "runs/x/checkpoints/update_00000002")  # as a run killed after its first checkpoint
    before = digest(node0 / "runs/x")
    options = ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
               f"127.0.0.1:{free_port()}"]
    argv = [str(ROOT / "train_policy.py"), *map(str, args)]
    jobs = [ForkedAgent(options, argv, tmp_path / f"launcher{i}.log", cwd=cwd) for i, cwd in enumerate((node0, node1))]
    codes = [job.wait(timeout=600) for job in jobs]
    out = "\n".join((tmp_path / f"launcher{i}.log").read_text() for i in range(2))
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert all(code != 0 for code in codes), out[-4000:]
    assert len(errors) == 1 and "is not the same run directory on every process" in errors[0], out[-4000:]
    assert "last checkpoint update_00000001" in errors[0] and "no run" in errors[0], out[-4000:]
    assert not re.findall(r'File "[^"]*(?:lm_human_preference_details/|train_policy\.py)', out), out[-4000:]
    assert digest(node0 / "runs/x") == before  # no checkpoint, log or marker written over node 0's run
    assert not (node1 / "runs/x").exists() or not any((node1 / "runs/x").iterdir())
