"""run.py: a run touches only what it created. Each rule of its docstring, the cases a user reaches with both scripts
(their main in this process, or in a fork of it where a second process is the point: a new interpreter would add only
its imports), and a randomized sequence of runs, resumes, overwrites and kills around a tree of user files."""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers.errors import assert_one_error_line
from helpers.events import drive
from helpers.processes import forked, in_fork, refused_in_process
from helpers.runs import end_of_update, run_args
from helpers.site.lmhp_events import EVENTS, SIGKILL_ONLY

import train_policy
import train_reward
from lm_human_preference_details import tasks
from lm_human_preference_details.language import model, tokenizer
from lm_human_preference_details.ranks import emulated as ranks
from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.run import checkpoint as ckpt
from lm_human_preference_details.run import lifecycle
from lm_human_preference_details.run.directory import LOCK, MARKER, read_marker
from lm_human_preference_details.run.lifecycle import Run
from lm_human_preference_details.run.signals import StopSignals, agree_after_update
from lm_human_preference_details.utils.errors import Stopped, UserError, run_main
from lm_human_preference_details.utils.files import remove_leftovers
from lm_human_preference_details.utils.outputs import atomic_dir

ROOT = Path(__file__).resolve().parents[2]


def fake_train(out, kind="policy", updates=3, inputs=(), **kw) -> None:
    """What both scripts do with a Run, on a one-layer model: enter, start, loop with logs and saves."""
    layer = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    with Run(run_args(out, **kw), kind, inputs=inputs, ranks=Ranks(1, 1)) as run:
        if run.finished:
            return
        objects = {"layer": layer, "optimizer": optimizer} if kind == "policy" else {}
        first = run.start({"seed": 1}, objects)
        for update in run.updates(first, updates, kind):
            optimizer.zero_grad()
            layer(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            run.log({"loss": float(update)}, step=update)
            end_of_update(run, update)
        if kind == "reward":
            (run.dir / "reward_model").mkdir()


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def user_tree(tmp_path):
    """A user's directory: notes, a config.json of their own, names like ours, a model directory."""
    home = tmp_path / "home"
    (home / "model").mkdir(parents=True)
    (home / "notes.txt").write_text("my notes")
    (home / "config.json").write_text('{"mine": true}')
    (home / ".draft.tmp-1").write_text("a user's file named like an old temporary")
    (home / ".paper.old-2").write_text("and one like an old backup")
    (home / "model" / "weights.bin").write_bytes(os.urandom(64))
    return home


# ------------------------------------------------------------------------------------------------ the rules
def test_a_run_never_starts_over_a_directory_that_is_not_its_own(user_tree):
    before = snapshot(user_tree)
    for flags in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(UserError, match="holds files that are not a run of this project"):
            fake_train(user_tree, **flags)
        with pytest.raises(UserError, match="not a run of this project"):
            fake_train(user_tree / "model", **flags)
    assert snapshot(user_tree) == before and not (user_tree / MARKER).exists()


def test_a_new_run_marks_its_directory_and_an_existing_one_needs_a_flag(tmp_path):
    out = tmp_path / "run"
    fake_train(out)
    assert read_marker(out)["kind"] == "policy" and (out / "metrics.jsonl").exists()
    before = snapshot(out)
    with pytest.raises(UserError, match="already holds a policy run; pass --resume to continue it, or --overwrite"):
        fake_train(out)
    assert snapshot(out) == before  # the refused run left the finished one as it was
    with pytest.raises(UserError, match="--output-dir is empty"):
        fake_train("")
    (tmp_path / "empty").mkdir()
    fake_train(tmp_path / "empty")  # an empty directory is as good as a new one


@pytest.mark.parametrize("script", ["train_reward", "train_policy"])
def test_resume_with_overwrite_is_one_line_before_any_model_or_process_group(script, tmp_path, monkeypatch, capsys):
    """A run in --output-dir, both flags: the one error line comes from the flags' checks, before a task's assets are
    built, a model or tokenizer loads, or torchrun's process group is joined (each of which fails the test here)."""
    out = tmp_path / "run"
    fake_train(out, kind=script.split("_")[1])
    before = snapshot(out)
    capsys.readouterr()  # the fake run's progress bar

    def too_soon(*args, **kwargs):
        pytest.fail("reached before the flags were all checked")

    for module, name in ((ranks, "setup_distributed"), (model, "load_lm"), (tokenizer, "load_tokenizer"),
                         (tasks.Task, "prepare"), (train_reward, "load_lm"), (train_policy, "load_lm"),
                         (train_reward, "load_tokenizer"), (train_policy, "load_tokenizer")):
        monkeypatch.setattr(module, name, too_soon)
    main = {"train_reward": train_reward.main, "train_policy": train_policy.main}[script]
    with pytest.raises(SystemExit) as exit_:
        run_main(lambda: main(["--task", "offline", "--output-dir", str(out), "--resume", "--overwrite"]))
    line = assert_one_error_line(subprocess.CompletedProcess([], exit_.value.code, "", capsys.readouterr().err))
    assert line == "error: --resume and --overwrite contradict each other; pass one of them"
    assert snapshot(out) == before


def test_a_run_of_the_other_kind_is_refused_with_every_flag(tmp_path):
    out = tmp_path / "run"
    fake_train(out, kind="policy")
    before = snapshot(out)
    for flags in ({}, {"resume": True}, {"overwrite": True}):
        with pytest.raises(UserError, match="holds a policy run, and this is a reward run"):
            fake_train(out, kind="reward", **flags)
    assert snapshot(out) == before


def test_overwrite_deletes_only_what_runs_write(tmp_path):
    out = tmp_path / "run"
    fake_train(out)
    (out / "notes.txt").write_text("the user's notes beside the run")
    first_id = read_marker(out)["id"]
    fake_train(out, overwrite=True, updates=2)
    assert (out / "notes.txt").read_text() == "the user's notes beside the run"
    assert read_marker(out)["id"] != first_id
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [0, 1]


def test_overwrite_is_refused_where_it_would_delete_an_input_or_the_current_directory(tmp_path, monkeypatch):
    out = tmp_path / "run"
    fake_train(out, kind="reward")
    model = out / "reward_model"
    with pytest.raises(UserError, match=f"--overwrite would delete {model}, an input of this run"):
        fake_train(out, kind="reward", overwrite=True, inputs=["gpt2", str(model)])
    monkeypatch.chdir(model)
    with pytest.raises(UserError, match="holds the current directory"):
        fake_train(out, kind="reward", overwrite=True)
    assert model.is_dir()


def test_a_finished_reward_run_is_reused_and_an_unfinished_one_trained_again(tmp_path, capsys):
    out = tmp_path / "reward"
    fake_train(out, kind="reward")
    stamp = (out / "reward_model").stat().st_mtime_ns
    fake_train(out, kind="reward", resume=True)
    assert "reusing the finished reward model" in capsys.readouterr().out
    assert (out / "reward_model").stat().st_mtime_ns == stamp
    (out / "reward_model").rmdir()
    (out / "notes.txt").write_text("kept")
    fake_train(out, kind="reward", resume=True)
    assert "deleting the unfinished run" in capsys.readouterr().out and (out / "notes.txt").read_text() == "kept"


def test_a_live_run_holds_its_directory_and_a_killed_one_does_not(tmp_path):
    """The holder is a fork of this process (the lock is the kernel's, per process: a new interpreter would add only its
    imports)."""
    out = tmp_path / "run"
    read, write = os.pipe()

    def stand() -> None:  # a run that stands in its directory until it is killed
        with Run(run_args(out), "policy", inputs=[], ranks=Ranks(1, 1)):
            os.write(write, b"locked")
            signal.pause()

    holder = in_fork(stand)
    os.close(write)
    try:
        assert os.read(read, 6) == b"locked"
        with pytest.raises(UserError, match=rf"{out} is in use by a live run \(pid {holder} on "):
            fake_train(out, resume=True)
    finally:
        os.kill(holder, signal.SIGKILL)  # kill -9: the kernel drops its lock
        os.waitpid(holder, 0)
        os.close(read)
    fake_train(out, resume=True)  # the stale lock file is no obstacle
    assert (out / LOCK).exists()


def test_a_run_directory_on_a_file_system_without_locks_is_refused_in_one_line(tmp_path, monkeypatch):
    """flock answered ENOLCK (NFS without a lock daemon): no run may start there unguarded; nothing is left."""
    import errno

    import filelock._unix

    def no_locks(fd: int) -> bool:
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(filelock._unix, "lock_fd_nonblocking", no_locks)
    with pytest.raises(UserError, match=rf"cannot lock {tmp_path / 'run' / LOCK} \({os.strerror(errno.ENOLCK)}\); pass"):
        fake_train(tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_run_that_fails_before_it_starts_leaves_nothing(tmp_path):
    out = tmp_path / "new" / "run"
    with pytest.raises(UserError, match="late check"):
        with Run(run_args(out), "policy", inputs=[], ranks=Ranks(1, 1)):
            raise UserError("late check")
    assert not out.exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError):
        with Run(run_args(tmp_path / "empty"), "policy", inputs=[], ranks=Ranks(1, 1)):
            raise UserError("late check")
    assert (tmp_path / "empty").is_dir() and not any((tmp_path / "empty").iterdir())  # the user's, kept


def test_leftovers_of_killed_writes_are_ours_alone_and_only_when_their_process_is_gone(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    from lm_human_preference_details.utils.files import HOST

    (tmp_path / f".lmhp-tmp~{HOST}~{dead.pid}~offline-v4~abc").mkdir()  # a killed asset build
    (tmp_path / f".lmhp-tmp~{HOST}~{os.getpid()}~other~abc").mkdir()  # a live process's write
    (tmp_path / f".lmhp-tmp~another-host~{dead.pid}~x~abc").mkdir()  # another machine's: not ours to judge
    (tmp_path / f".lmhp-old~{HOST}~{dead.pid}~policy").mkdir()  # killed between the renames: comes back
    (tmp_path / ".x.tmp-1").write_text("user")
    (tmp_path / ".y.old-2").write_text("user")
    assert sorted(remove_leftovers(tmp_path)) == [f".lmhp-old~{HOST}~{dead.pid}~policy",
                                                  f".lmhp-tmp~{HOST}~{dead.pid}~offline-v4~abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        f".lmhp-tmp~{HOST}~{os.getpid()}~other~abc", f".lmhp-tmp~another-host~{dead.pid}~x~abc", ".x.tmp-1", ".y.old-2",
        "policy"])
    (tmp_path / MARKER).write_text('{"kind": "policy"}')  # a run's entry: the gate lets it be replaced
    with atomic_dir(tmp_path / "policy") as tmp:
        (tmp / "new").write_text("1")
    assert (tmp_path / "policy" / "new").exists()


# ------------------------------------------------------------------------------------------------ signals
def test_stop_signals_become_a_flag_and_two_interrupts_stop_at_once():
    before = signal.getsignal(signal.SIGTERM)
    with StopSignals() as stop:
        signal.raise_signal(signal.SIGTERM)  # to this (the main) thread: its handler runs before the next line
    assert (stop.signum, stop.name) == (signal.SIGTERM, "SIGTERM")
    assert signal.getsignal(signal.SIGTERM) is before  # the old handler is back
    with StopSignals() as slurm:
        signal.raise_signal(signal.SIGUSR1)  # Slurm's --signal=USR1@T: a stop like SIGTERM
    assert slurm.name == "SIGUSR1"
    with StopSignals() as twice:
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert twice.signum == signal.SIGINT


def test_once_the_processes_agreed_to_stop_a_late_signal_changes_nothing(monkeypatch):
    """Under torchrun, leaving the loop after an agreed stop ignores the stop signals: torchrun's SIGTERM to the
    processes still leaving cannot replace the agreed stop with an interruption."""
    monkeypatch.setenv("WORLD_SIZE", "2")

    def late(signum, frame):
        raise AssertionError("a late signal interrupted a process on its way out")

    before = {s: signal.getsignal(s) for s in StopSignals.SIGNALS}
    signal.signal(signal.SIGTERM, late)
    try:
        with StopSignals() as stop:
            stop.leaving = True  # as Run.updates sets it once every process agreed to stop
        signal.raise_signal(signal.SIGTERM)  # handled before the next line: `late` would raise here
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


class TwoProcesses:
    """`Ranks` as `agree_after_update` sees it on one of two processes: the other's flags arrive in the sum."""

    def __init__(self, others: list[float]):
        self.others, self.agreed = torch.tensor(others), []

    def sum(self, flags: torch.Tensor) -> torch.Tensor:
        return flags + self.others

    def agree_on(self, error):
        self.agreed.append(error)


def test_processes_that_received_different_signals_agree_on_one_and_on_a_failure():
    """Each process learns which stop signals reached any (flags in STOP_SIGNALS' order: SIGTERM, SIGINT, SIGUSR1, then
    "process 0's writer failed"); all take the first of those received, so every process says and exits alike."""
    here = StopSignals()
    here.signum = signal.SIGUSR1  # Slurm's warning here, docker stop's SIGTERM on the other process
    ranks = TwoProcesses([1.0, 0.0, 0.0, 0.0])
    assert agree_after_update(ranks, here, None) and here.signum == signal.SIGTERM and ranks.agreed == []
    other = StopSignals()
    other.signum = signal.SIGTERM  # the other side of the same job: it keeps SIGTERM
    assert agree_after_update(TwoProcesses([0.0, 0.0, 1.0, 0.0]), other, None) and other.signum == signal.SIGTERM
    quiet = StopSignals()
    assert not agree_after_update(TwoProcesses([0.0] * 4), quiet, None) and quiet.signum is None
    failed = TwoProcesses([0.0, 0.0, 0.0, 1.0])  # process 0's checkpoint writer failed; this process saw no error
    assert not agree_after_update(failed, quiet, None) and failed.agreed == [None]


def test_two_interrupts_during_one_long_operation_stop_at_once():
    """Ctrl-C twice while the main thread is inside one long C call: Python runs its handler once for both."""
    go = threading.Event()

    def send_twice():  # thread-directed, to this thread, which does not block SIGINT: its C-level handler runs twice
        go.wait()
        for _ in range(2):
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)

    sender = threading.Thread(target=send_twice)
    sender.start()  # before the main thread blocks SIGINT: a new thread inherits the mask
    with StopSignals():
        with pytest.raises(KeyboardInterrupt):
            # the main thread blocks SIGINT, so Python runs our handler only after both have arrived
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                go.set()
                sender.join()
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
            time.sleep(0.01)


def test_a_stopped_run_saves_and_says_so(tmp_path, monkeypatch):
    out = tmp_path / "run"
    real_log = Run.log

    def log_then_sigterm(self, stats, step):
        real_log(self, stats, step)
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Run, "log", log_then_sigterm)
    with pytest.raises(Stopped, match=r"stopped by SIGTERM after update 2; saved .*update_00000003; continue"):
        fake_train(out, updates=10)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["update_00000003"]


class ProcessZeroOfTwo(Ranks):
    """Process 0 of a two-process job as `Run` sees it, without the peer: each collective sees this process's part."""

    def __init__(self):
        super().__init__(1, 1)
        self.world_size = 2

    def sum(self, x):
        return x

    def from_main(self, value):
        return value

    def agree_on(self, error):
        if error is not None:
            raise error


def test_a_tracker_write_that_fails_after_the_loop_stops_every_process_at_the_models_save(tmp_path, monkeypatch):
    """Under torchrun process 0 keeps a failed log for the next agreement; after the reward loop (held-out results,
    normalisation) that is the final model's save, which then writes nothing."""
    import lm_human_preference_details.run.lifecycle as run_module
    from lm_human_preference_details.run.tracking import Tracker

    real_log = Tracker.log

    def full_after_the_loop(self, metrics, step):
        if step >= 1:
            raise OSError(28, "No space left on device")
        real_log(self, metrics, step)

    monkeypatch.setattr(Tracker, "log", full_after_the_loop)
    monkeypatch.setattr(run_module, "save_model_dir", lambda path, *args: path.mkdir())
    with Run(run_args(tmp_path / "run"), "reward", inputs=[], ranks=ProcessZeroOfTwo()) as run:
        run.start({"seed": 1})
        for batch in run.updates(0, 1, "reward model"):
            run.log({"loss": 1.0}, step=batch)
            end_of_update(run, batch)
        run.log({"eval/accuracy": 0.5}, step=1)  # kept, not raised: the peer is on its way to the save's collective
        with pytest.raises(OSError, match="No space left"):
            run.save_model("reward_model", torch.nn.Linear(1, 1), {})
    assert not (tmp_path / "run" / "reward_model").exists()


# ------------------------------------------------------------------------------------------------ the scripts
def script(name, *argv, cwd=ROOT):
    """``python NAME ARGV`` in ``cwd`` in this process (conftest's `refused_in_process`) -> its exit status and output.
    For runs that are refused before any model loads, where a new interpreter would add only its imports."""
    return refused_in_process(name, argv, cwd)


def refused(proc, match):
    assert_one_error_line(proc, match, status=None, alone=False)


def fake_run_dir(path: Path, kind: str) -> Path:
    """A finished run's directory as the scripts leave it (its marker, logs, models), with the user's notes."""
    path.mkdir(parents=True)
    (path / MARKER).write_text(json.dumps({"kind": kind, "id": "x"}))
    (path / "config.json").write_text("{}")
    (path / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    model = path / ("policy" if kind == "policy" else "reward_model")
    model.mkdir()
    (model / "model.safetensors").write_bytes(os.urandom(32))
    (path / "notes.md").write_text("results discussed with the team")
    return path


def test_the_scripts_never_delete_what_is_not_theirs(assets, tmp_path):
    """The cases a user reaches in a normal week; each one ends in one line and leaves every file as it was. Each case
    in this process (`script`): all are refused by the flags' and run directory's checks."""
    tiny = ["--task.query-dataset", assets / "queries.txt", "--task.query-length", 64, "--task.response-length", 24,
            "--task.truncate-after", 4, "--device", "cpu"]
    reward = ["--base-model", assets / "tiny-gpt2", "--labels.source", assets / "labels.json", "--labels.num-train", 64,
              "--batch-size", 16, *tiny]
    from lm_human_preference_details.language.model import RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    policy_run, reward_run = fake_run_dir(tmp_path / "policy_run", "policy"), fake_run_dir(tmp_path / "reward_run", "reward")
    tokenizer = load_tokenizer(str(assets / "tiny-gpt2"))  # a reward model the policy script accepts
    save_model_dir(reward_run / "reward_model", RewardModel(load_lm(str(assets / "tiny-gpt2")), tokenizer.pad_token_id),
                   tokenizer, {"task": {"query_length": 64, "response_length": 24}})
    user = tmp_path / "user"
    user.mkdir()
    (user / "config.json").write_text('{"the user": "config"}')
    (user / ".x.tmp-1").write_text("a user's file")
    model_copy = tmp_path / "base"
    (model_copy).mkdir()
    for f in (assets / "tiny-gpt2").iterdir():
        (model_copy / f.name).write_bytes(f.read_bytes())
    (model_copy / "NOTES").write_text("where this model came from")
    before = snapshot(tmp_path)
    reward_cases = [
        # a finished policy run given to the reward script with --resume
        ([*reward, "--output-dir", policy_run, "--resume"], "holds a policy run", ROOT),
        # --output-dir . --overwrite where the current directory holds a config.json of the user's
        ([*reward, "--output-dir", ".", "--overwrite"], "not a run of this project", user),
        # the base model's directory as the run directory
        ([*reward[2:], "--base-model", model_copy, "--output-dir", model_copy, "--overwrite"], "not a run of this project",
         ROOT),
        # a new run into a directory of the user's (with names like our old temporaries)
        ([*reward, "--output-dir", user], "not a run of this project", ROOT),
    ]
    policy_cases = [
        # the policy's own reward model, in the directory it is told to overwrite
        (["--base-model", assets / "tiny-gpt2", *tiny, "--rewards.trained-model", reward_run / "reward_model",
          "--output-dir", reward_run, "--overwrite"], "holds a reward run", ROOT),
        # a policy run resumed into a reward run
        (["--base-model", assets / "tiny-gpt2", *tiny, "--output-dir", reward_run, "--resume"], "holds a reward run", ROOT),
    ]
    for name, cases in (("train_reward.py", reward_cases), ("train_policy.py", policy_cases)):
        for argv, match, cwd in cases:
            refused(script(name, *argv, cwd=cwd), match)
    assert snapshot(tmp_path) == before


def test_two_runs_into_one_new_directory_cannot_both_proceed(assets, tmp_path):
    """The first run is a process of its own (a fork, helpers.processes.forked), stopped at its first batch while it holds the
    directory, 2 batches in all; the second, refused at the directory's lock before any model loads, runs in this
    process (`script`)."""
    out = tmp_path / "run"
    argv = ["--base-model", assets / "tiny-gpt2", "--labels.source", assets / "labels.json", "--task.query-dataset",
            assets / "queries.txt", "--device", "cpu", "--labels.num-train", 16, "--batch-size", 8, "--rollout-batch-size", 8,
            "--normalize-samples", 8, "--eval-labels", 0, "--output-dir", out]
    events, log = tmp_path / "events", tmp_path / "first.log"
    second = []

    def race(event: str) -> None:  # the first run holds the directory and stands still at its first batch
        if not second:
            second.append(script("train_reward.py", *argv, "--resume"))

    code, seen = drive(forked("train_reward.py", *argv, env_extra={EVENTS: events}, stdout=log), events, race)
    assert code == 0, log.read_text()[-3000:]
    assert seen[0] == "update 0" and len(second) == 1
    refused(second[0], "is in use by a live run")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "train_reward/minibatch/loss" in r] == [0, 1]  # one run's rows only


# ------------------------------------------------------------------------------------------------ randomized
USER_FILES = ["notes.txt", "config.json", "metrics.jsonl", ".z.tmp-3", "a/data.json", "a/b/.q.old-9", "models/m/weights.bin",
              "runs/README"]
# user files inside run directories (beside a run's entries, and in a policy run's own reward run)
USER_FILES_IN_RUNS = ["runs/r2/notes.md", "runs/r2/analysis/plot.py", "runs/r2/.draft.tmp-1", "runs/r3/reward/mine.txt",
                      "runs/r3/todo.txt", "runs/r4/notes.txt"]
# where runs are sent (the user's own directories too), and the kind of run each one mostly gets
TARGETS = {"": "policy", ".": "reward", "a": "policy", "a/b": "reward", "models/m": "policy", "runs": "policy",
           "runs/r1": "policy", "runs/r1/reward": "reward", "new/deeper/run": "policy", "runs/r3/reward": "reward",
           "runs/r2": "policy", "runs/r3": "policy", "runs/r4": "reward", "runs/r5": "policy"}


def user_home(home: Path) -> None:
    """A user's tree: files of their own, three runs (r2 and r3 policy runs, r3 with its own reward run, r4 a reward run)
    and the user's files inside them."""
    for i, name in enumerate(USER_FILES):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_bytes(f"user file {i}: ".encode() + os.urandom(16))
    fake_train(home / "runs/r2", "policy")
    fake_train(home / "runs/r3", "policy")
    fake_train(home / "runs/r3/reward", "reward")
    fake_train(home / "runs/r4", "reward")
    for i, name in enumerate(USER_FILES_IN_RUNS):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_bytes(f"user file in a run {i}: ".encode() + os.urandom(16))


def fake_train_in_fork(path: str, kind: str, inputs: list[str], flags: dict, events: Path) -> int:
    """In a forked child (`in_fork`): `fake_train` with the events hook on -> its exit status: 0 when it ran (or reused a
    finished run), 3 when it was refused (the error printed)."""
    os.environ[EVENTS], os.environ[SIGKILL_ONLY] = str(events), "1"  # killed, never signalled otherwise
    try:
        fake_train(path, kind, updates=4, inputs=inputs, **flags)
    except UserError as e:
        print(f"error: {e}")
        return 3
    return 0


CLEARED, RESUMED = "cleared a run (--overwrite, or an unfinished reward run)", "resumed from a checkpoint"


def random_run(rng: random.Random, home: Path, work: Path) -> list[str]:
    """Draw a run (where, which kind, flags, inputs) and whether to SIGKILL it at an update or in a checkpoint write;
    run it in a forked child, kill it at that event if it comes, and check how it ended. -> what it did."""
    out = rng.choice([*TARGETS, *["runs/r2", "runs/r3", "runs/r4", "runs/r5", "new/deeper/run"] * 3])
    kind = TARGETS[out] if rng.random() < 0.8 else rng.choice(["policy", "reward"])
    flags = rng.choice([{}, {"resume": True}, {"resume": True}, {"overwrite": True}, {"overwrite": True},
                        {"resume": True, "overwrite": True}])
    inputs = [str(home / "models/m"), str(home / "a/data.json"), rng.choice(["gpt2", str(home / "runs/r1")])]
    plan, at = rng.choice(["no kill", "kill in training", "kill in a checkpoint write"]), rng.randrange(4)
    # the first event of the drawn kind from a drawn update on (4 updates, a checkpoint after updates 2 and 4)
    kill_from = {"kill in training": ("update", at), "kill in a checkpoint write": ("checkpoint-writing", 2 + 2 * (at % 2))}
    killed = []

    def act(event: str) -> None:
        name, number = event.split()
        if plan in kill_from and not killed and name == kill_from[plan][0] and int(number) >= kill_from[plan][1]:
            os.kill(pid, signal.SIGKILL)
            killed.append(event)

    events, log = work.with_suffix(".events"), work.with_suffix(".log")
    # some children are killed inside a progress bar's write: in_fork gives each a progress lock of its own
    pid = in_fork(lambda: fake_train_in_fork(str(home / out) if out else "", kind, inputs, flags, events), stdout=log)
    code, _ = drive(pid, events, act)
    output = log.read_text()
    if killed:
        assert code == -signal.SIGKILL, output
        done = [f"killed: {plan[5:]}"]
    else:
        assert code in (0, 3), f"{out} {kind} {flags}: exit {code}\n{output}"
        done = ["refused" if code == 3 else "ran to the end"]
    return done + [CLEARED] * ("deleting the" in output) + [RESUMED] * ("resume: continuing from" in output)


def test_random_runs_resumes_overwrites_and_kills_never_lose_a_user_file(tmp_path, monkeypatch):
    """Runs of both kinds, with every flag, into and around a tree of user files and runs holding user files; some are
    killed with SIGKILL at a drawn update or half-way through a drawn checkpoint write, at the event the run emits
    there. Every child ends as drawn, and afterwards every user file is there with its bytes. The fake runs draw no
    curves.png: their metrics fill none of its panels, and drawing four empty ones at each checkpoint was most of this
    test's CPU (~0.4 s each, 26 or more); what a drawing writes, and a drawing that fails, are tested in test_plots.py
    and below."""
    monkeypatch.setattr(lifecycle, "draw_curves", lambda run_dir: None)  # the forked children inherit it
    rng = random.Random(20261124)
    home = tmp_path / "home"
    user_home(home)
    before = {name: (home / name).read_bytes() for name in USER_FILES + USER_FILES_IN_RUNS}
    monkeypatch.chdir(home / "a")
    counts = collections.Counter(what for i in range(90) for what in random_run(rng, home, tmp_path / f"run-{i}"))
    print("\n".join(f"{n:3d} {what}" for what, n in sorted(counts.items())))
    assert counts["killed: in training"] >= 5 and counts["killed: in a checkpoint write"] >= 3, counts
    assert counts[CLEARED] >= 5 and counts["refused"] >= 10, counts
    after = snapshot(home)
    assert {k: after.get(k) for k in before} == before


def test_curves_that_cannot_be_drawn_are_a_warning_not_the_end_of_the_run(tmp_path, monkeypatch, capsys):
    import lm_human_preference_details.run.plots as plots

    def broken(run_dir):
        raise ValueError("no metrics yet")

    monkeypatch.setattr(plots, "write_run_curves", broken)
    plots.draw_curves(tmp_path)  # returns: the checkpoint beside it is written all the same
    err = capsys.readouterr().err.splitlines()
    assert err == [f"warning: {tmp_path / 'curves.png'} not drawn (ValueError: no metrics yet); training goes on"]
