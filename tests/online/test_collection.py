"""online/collection.py, the paper's online data collection: the schedule at hand-computed points, the flags, a small online
run of the offline task with the gold labeller, uninterrupted and killed then resumed, on one process and under torchrun
(2 processes, killed, resumed on 1); under torchrun, a command labeller and a stop on process 1."""

from __future__ import annotations

import copy
import hashlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.events import drive
from helpers.online import FakePolicy, FakeSampler, online_args
from helpers.processes import EXITS, ForkedAgent, differing, exit_statuses, forked, in_process, run_forked, started
from helpers.site.lmhp_events import EVENTS, KILL_AT, SIGKILL_ONLY

from lm_human_preference_details.label_format import load_best_of_n_labels
from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.offline import corpus as offline_corpus
from lm_human_preference_details.offline import report as offline_report
from lm_human_preference_details.online.labellers import AnswersAtOnce
from lm_human_preference_details.online.schedule import Schedule
from lm_human_preference_details.run.checkpoint import list_checkpoints
from lm_human_preference_details.run.directory import LOCK, MARKER, RUN_KINDS, clear_run
from lm_human_preference_details.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]


def test_the_gold_labeller_needs_a_task_with_a_gold_scorer():
    import train_policy

    args = train_policy.build_args("sentiment")
    args.online.num_labels = 10**6
    with pytest.raises(UserError, match="--online.labeller gold needs a task with a gold scorer"):
        args.finalize(check_inputs=False)


def test_the_offline_online_preset_is_the_offline_task_online_with_a_quarter_of_its_labels_first(capsys):
    import train_policy
    from lm_human_preference_details.cli.parsing import parse_args

    offline_args, online = train_policy.build_args("offline"), train_policy.build_args("offline-online")
    total = offline_args.rewards.train_new_model.labels.num_train  # the labels the offline task trains on
    assert (total, online.online.num_labels, online.rewards.train_new_model.labels.num_train) == (1536, 1536, 384)
    assert online.online.labeller == "gold" and online.online.margin == 64 and online.online.retrainings == 19
    assert not offline_args.online.enabled
    # everything else is the offline preset's
    online.online, online.task_name = offline_args.online, "offline"
    online.rewards.train_new_model.labels.num_train = total
    assert online == offline_args
    assert online_args(task="offline-online").online.num_labels == 1536  # its flags check
    with pytest.raises(SystemExit):
        parse_args(train_policy.build_args, "train_policy", ["--task", "offline-online", "--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert "offline-online" in shown and "(default: 1536)" in shown


# 2 updates of 16 episodes (2 emulated ranks: whitening groups of 8), N_r^0 = 8, N_r = 48, margin 12, 1 + 1 trainings
# in the reward model's batches of 8 (the offline preset's): the least that still has two request batches before each
# update (a kill between them finds a label file written), a retraining between the updates, and several reward batches
# in it
SMALL = ["--task", "offline", "--ppo.total-episodes", "32", "--ppo.batch-size", "16", "--num-ranks", "2",
         "--save-interval", "1", "--sample-print-interval", "100",
         "--rewards.train-new-model.labels.num-train", "8", "--rewards.train-new-model.normalize-samples", "16",
         "--rewards.train-new-model.rollout-batch-size", "16", "--rewards.train-new-model.eval-labels", "8",
         "--online.num-labels", "48", "--online.retrainings", "1", "--online.margin", "12"]


def policy_command(run_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, str(ROOT / "train_policy.py"), *SMALL, "--output-dir", str(run_dir), *extra]


def environment(cache: Path) -> dict:
    # the closing report on 16 held-out queries, not 256: these tests read the run's labels, metrics and weights, and of
    # summary.json only that it was written (tests/offline/test_task.py checks the report at its real size)
    return {**os.environ, "LMHP_CACHE": str(cache), "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled",
            "OMP_NUM_THREADS": "1", offline_report.HELDOUT_QUERIES_HOOK: "16"}


@pytest.fixture(scope="module")
def online_run(tmp_path_factory, offline_cache) -> Path:
    """The small run (SMALL), uninterrupted, as users start it (`python train_policy.py`, a process of its own: a fork of
    this one, helpers.processes.run_forked); seconds: a model load, two reward trainings, two PPO updates and the
    offline task's closing evaluation."""
    run_dir = tmp_path_factory.mktemp("online") / "run"
    env = differing(environment(offline_cache))
    result = run_forked("train_policy.py", *policy_command(run_dir)[2:], env_extra=env, cwd=run_dir.parent)
    assert result.returncode == 0, result.stdout[-3000:]
    return run_dir


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not any(w in k for w in ("time", "fps", "elapsed"))} for r in rows]


def test_an_online_run_writes_gold_labels_of_its_current_policy(online_run):
    tokenizer = gpt2_tokenizer()
    label_file = online_run / "online" / "labels.json"
    labels = load_best_of_n_labels(label_file, n=4, query_length=offline_corpus.QUERY_LENGTH,
                                   response_length=offline_corpus.RESPONSE_LENGTH, pad_id=tokenizer.pad_token_id)
    gold = offline_corpus.gold_scores(tokenizer, labels["samples"].reshape(-1, offline_corpus.RESPONSE_LENGTH)).view(-1, 4)
    assert torch.equal(labels["best"], gold.argmax(1))  # the gold labeller's best-of-4 pick
    updates = [r["update"] for r in json.loads(label_file.read_text())]
    # l(0) + margin = 20 -> two batches of 16 requests before update 0; l(16) + margin = 8 + 40 * (1 - (1/2)^2) + 12
    # = 50 -> two more batches, 64, before update 1
    assert updates == [0] * 32 + [1] * 32
    rows = metrics(online_run)
    assert [r["online/requests"] for r in rows] == [32, 64] and [r["online/pending"] for r in rows] == [0] * 2
    assert [r["online/labels_wanted"] for r in rows] == [8, 38]
    assert [r["online/retrainings"] for r in rows] == [1, 2]  # points 8 and 28: <= l(0) = 8, <= l(16) = 38
    # each training: the label file's first labels, whole batches of 8, a seed of its own (a new random head)
    for k, num_train in enumerate([8, 24]):  # 28 // 8 * 8 = 24
        config = json.loads((online_run / "online" / f"reward_{k:02d}" / "config.json").read_text())
        assert config["labels"]["num_train"] == num_train and config["labels"]["source"] == str(label_file)
        assert config["seed"] == 1 + k
        assert rows[k]["online/retraining/labels"] == num_train
        assert 0 <= rows[k]["online/retraining/heldout_accuracy"] <= 1 and rows[k]["online/retraining/loss"] > 0
    assert json.loads((online_run / "summary.json").read_text())["trained/kl"] > 0


def test_overwrite_deletes_all_that_an_online_run_wrote(online_run, tmp_path):
    """--overwrite deletes only the entries runs write (run_kinds.RUN_ENTRIES): an online run's online/ (its label file
    and reward trainings) is one, so a run started again over it begins with no labels of the last one."""
    copy = tmp_path / "run"
    shutil.copytree(online_run, copy, symlinks=True)
    assert (copy / "online" / "labels.json").is_file()
    clear_run(copy, RUN_KINDS["policy"].entries)
    kept = sorted(name for name in os.listdir(online_run) if name in (MARKER, LOCK))  # the lock file, if it stays
    assert MARKER in kept and sorted(os.listdir(copy)) == kept


# Where each case kills the run (SIGKILL) before it is resumed, as events of the run's hook (helpers.events); "A | B":
# event B right after A. The small run's events: online-request 1, 2; training 0's batch, update 0; the policy's update 0;
# checkpoint-writing 1; online-request 3, 4; training 1's batches, update 0..2; the policy's update 1; ... With each
# kill point, what the kill left (what_is_left): the checkpoints, the answers recorded, the label file's records, the
# trainings with a saved model. A request batch's answers reach the label file after its event.
KILLS = {
    # while requests are labelled, between two request batches: before the first checkpoint (a resume finds none,
    # cuts the label file back and starts again), then before update 1 (the label file past checkpoint 1's 32 labels)
    "labelling": [("online-request 2", ([], 32, 16, [])),
                  ("online-request 4", (["update_00000001"], 64, 48, ["reward_00"]))],
    # the second training's first batch
    "retraining": [("online-request 4 | update 0", (["update_00000001"], 64, 64, ["reward_00"]))],
    # (in PPO, update 1 done and not yet saved: the state the 2-process run below is killed in, and resumed from)
}


def killed_at(run_dir: Path, env: dict, at: str, resume: bool) -> None:
    """Run (or --resume) the small online run, a fork of this process with the events hook on (`forked`: a process of
    its own without a new interpreter's imports), and SIGKILL it at the event ``at``. ``env``: the variables it sees
    beside this process's."""
    events = run_dir.parent / f"events_{at.replace(' ', '_')}"
    pid = forked("train_policy.py", *policy_command(run_dir, *(["--resume"] if resume else []))[2:],
                 env_extra={**env, EVENTS: events, SIGKILL_ONLY: "1"}, cwd=run_dir.parent)
    seen: list[str] = []

    def act(event: str) -> None:
        seen.append(event)
        if " | ".join(seen[-2:]) == at or (" | " not in at and event == at):
            os.kill(pid, signal.SIGKILL)

    code, _ = drive(pid, events, act)
    assert code == -signal.SIGKILL, f"not killed at {at!r}; events {seen}"


def what_is_left(run_dir: Path) -> tuple[list[str], int, int, list[str]]:
    """A killed run's directory: its checkpoints, the answers recorded (online/answers.jsonl), the label file's records,
    the online trainings with a saved model."""
    online = run_dir / "online"
    label_file = json.loads((online / "labels.json").read_text()) if (online / "labels.json").exists() else []
    return ([p.name for p in list_checkpoints(run_dir)], len((online / "answers.jsonl").read_text().splitlines()),
            len(label_file), sorted(p.parent.name for p in online.glob("reward_*/reward_model")))


@pytest.fixture(scope="module")
def killed_chain(tmp_path_factory, offline_cache) -> tuple[Path, dict]:
    """The small run killed at every point of KILLS in turn (the first run fresh, each next one --resume from what the
    last kill left), then resumed to its end -> (its directory, {kill point: what_is_left after it}). One chain, not a
    fresh run per case: each kill still leaves the state its case names, and one resume to the end serves both.
    Seconds: four runs (the last in this process), each a model load and what it redoes after its last checkpoint."""
    run_dir = tmp_path_factory.mktemp("killed") / "run"
    env = differing(environment(offline_cache))
    left = {}
    for i, (at, _) in enumerate(kill for kills in KILLS.values() for kill in kills):
        killed_at(run_dir, env, at, resume=i > 0)
        left[at] = what_is_left(run_dir)
    assert not (run_dir / "summary.json").exists()  # killed before its end, every time
    # the last resume runs to the end in this process (helpers.processes.in_process: the same run bit for bit on one thread,
    # without a new interpreter's imports); the killed runs are processes of their own (forks of this one), the
    # uninterrupted one a new interpreter
    in_process("train_policy.py", *policy_command(run_dir, "--resume")[2:], cwd=run_dir.parent, env_extra=env)
    return run_dir, left


@pytest.mark.parametrize("case", list(KILLS))
def test_a_killed_online_run_resumes_to_the_same_numbers(online_run, killed_chain, case):
    """kill -9 while labelling or in a retraining, then --resume: the label file, metrics and policy of the
    uninterrupted run, bit for bit (gold labeller, --exact-ranks: the offline preset's). Seconds: the two runs."""
    run_dir, left = killed_chain
    for at, state in KILLS[case]:
        assert left[at] == state, f"the kill at {at!r} left {left[at]}"
    assert (run_dir / "online" / "labels.json").read_bytes() == (online_run / "online" / "labels.json").read_bytes()
    assert metrics(run_dir) == metrics(online_run)
    for name in ("model.safetensors", "head.safetensors"):  # the policy's weights, its value head
        assert (run_dir / "policy" / name).read_bytes() == (online_run / "policy" / name).read_bytes()


def test_an_online_run_on_two_processes_is_the_one_process_run_and_resumes_on_one(online_run, tmp_path, offline_cache):
    """The small run under torchrun (2 processes, --exact-ranks, the gold labeller: process 0 samples the requests and
    labels them, both train) killed -9 as it writes its last checkpoint, then --resume on 1 process: the 2 processes
    had written the uninterrupted 1-process run's labels to the label file, logged its metrics and trained its policy
    (the checkpoint being written holds it), bit for bit; the resumed run reuses
    the finished trainings and the answers given (none asked again) and ends with that run's label file, metrics and
    policy. Seconds: a torchrun job of the whole run (torchrun's agent in a fork, helpers.processes.started: what is
    promised is the processes' numbers, not torchrun's command line), then its last update and report in this process."""
    from lm_human_preference_details.utils.torchrun import torchrun_world

    assert torchrun_world()[0] == 1  # the resume below runs in this process, as one process
    run_dir = tmp_path / "run"
    env = environment(offline_cache)
    # process 0 passes this event alone, in its checkpoint writer after update 1: both updates logged, not yet saved
    changed = differing(env)
    job = started("train_policy.py", 2, *policy_command(run_dir)[2:], env_extra={**changed, KILL_AT: "checkpoint-writing 2"},
                  cwd=tmp_path, check=False)()
    assert job.returncode != 0 and "Signal 9 (SIGKILL) received" in job.stderr, job.stderr[-3000:]
    online = run_dir / "online"
    assert what_is_left(run_dir) == (["update_00000001"], 64, 64, ["reward_00", "reward_01"])
    assert (online / "labels.json").read_bytes() == (online_run / "online" / "labels.json").read_bytes()
    assert metrics(run_dir) == metrics(online_run)  # the 2 processes' rows, flushed before the checkpoint is written
    # the 2 processes' policy after the last update, in the checkpoint written when the kill came (not yet in place):
    # the 1-process run's, tensor for tensor
    written, = (run_dir / "checkpoints").glob("*~update_00000002~*/state.pt")
    mine = torch.load(written, weights_only=True)["objects"]["policy"]
    theirs = torch.load(online_run / "checkpoints" / "update_00000002" / "state.pt", weights_only=True)["objects"]["policy"]
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in theirs)
    before = torch.load(run_dir / "checkpoints" / "update_00000001" / "state.pt", weights_only=True)["objects"]["policy"]
    assert not all(torch.equal(before[k], theirs[k]) for k in theirs)  # the last update changed it: a real comparison

    in_process("train_policy.py", *policy_command(run_dir, "--resume")[2:], cwd=tmp_path, env_extra=changed)
    assert (online / "answers.jsonl").read_bytes() == (online_run / "online" / "answers.jsonl").read_bytes()
    assert (online / "labels.json").read_bytes() == (online_run / "online" / "labels.json").read_bytes()
    assert metrics(run_dir) == metrics(online_run)
    for name in ("model.safetensors", "head.safetensors"):
        assert (run_dir / "policy" / name).read_bytes() == (online_run / "policy" / name).read_bytes()


# a program labeller that says when it started (its pid, and its parent's: the process that runs it) and when it was
# asked, then never answers (it ends when its input closes)
SILENT_JUDGE = """import os, sys
def say(what):
    with open(sys.argv[1], "a") as f:
        f.write(what + "\\n")
say(f"started {os.getpid()} {os.getppid()}")
sys.stdin.readline()
say("asked")
sys.stdin.read()
"""


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if f"\nPPid:\t{pid}\n" in (entry / "status").read_text():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found


def test_under_torchrun_process_0_alone_runs_the_program_and_a_stop_on_process_1_ends_the_wait(tmp_path, offline_cache):
    """The small run under torchrun (2 processes) with a command labeller that never answers: process 0 alone starts
    the program; SIGTERM to process 1 alone, while process 0 waits for the program's answer, ends the whole job in
    one `stopped by SIGTERM` line, every process with status 143, and the program is ended. A hang (process 0 never
    learning of process 1's stop) fails the test after 60 s. Seconds: a torchrun job's model loads (torchrun's agent
    and its workers forked from this process, helpers.processes.ForkedAgent: what is promised is the processes' wait
    and statuses; what torchrun's command line prints and reports is tested on the real command in
    tests/ranks/test_failures.py and tests/run/test_signals.py)."""
    judge, said, exits = tmp_path / "judge.py", tmp_path / "judge.log", tmp_path / "exits"
    judge.write_text(SILENT_JUDGE)
    argv = policy_command(tmp_path / "run", "--online.labeller", "command", "--online.command",
                          f"{sys.executable} {judge} {said}")[1:]
    job = ForkedAgent(["--standalone", "--nproc-per-node", "2"], argv, tmp_path / "job.log",
                      env_extra={**differing(environment(offline_cache)), EXITS: exits}, cwd=tmp_path)
    try:
        while "asked" not in (said.read_text() if said.exists() else ""):
            assert job.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
            time.sleep(0.1)
        time.sleep(1)  # process 1 waits in the collection's poll by now
        process_0 = int(said.read_text().split()[2])  # the program's parent
        process_1, = [pid for pid in children(job.pid) if pid != process_0]
        os.kill(process_1, signal.SIGTERM)
        stopped = time.monotonic()
        job.wait(timeout=60)
    finally:
        if job.poll() is None:  # the workers first, then the agent
            for pid in children(job.pid):
                os.kill(pid, signal.SIGKILL)
            job.send_signal(signal.SIGKILL)
            job.wait()
    print(f"SIGTERM to process 1 -> the job ended {time.monotonic() - stopped:.1f} s later")
    lines = said.read_text().splitlines()
    assert [line.split()[0] for line in lines] == ["started", "asked"], lines  # one program, asked once
    with pytest.raises(ProcessLookupError):
        os.kill(int(lines[0].split()[1]), 0)  # ended with the run
    out = (tmp_path / "job.log").read_text()
    ours = [line for line in out.splitlines() if line.startswith("error:")]
    assert len(ours) == 1 and ours[0].startswith("error: stopped by SIGTERM while --online.command") and \
        "request 0 was asked" in ours[0], out[-3000:]
    assert exit_statuses(exits) == {0: 143, 1: 143}, out[-3000:]


class SkipEveryThird(AnswersAtOnce):
    name = "judge.py"

    def __init__(self):
        self.asked = 0

    def label(self, queries, samples):
        answers = [None if (self.asked + i) % 3 == 2 else 0 for i in range(len(queries))]
        self.asked += len(queries)
        return answers


def collection(label_path: Path, trained: list):
    from types import SimpleNamespace

    from lm_human_preference_details.online.collection import OnlineCollection
    from lm_human_preference_details.online.label_file import OnlineLabelFile

    schedule = Schedule(initial_labels=8, final_labels=40, total_episodes=64, margin=2, retrainings=3)
    task = SimpleNamespace(response_length=3, truncate_token=None, truncate_after=0)

    def train(k, num_train):
        trained.append((k, num_train))
        return f"model {k}", {"last_loss": 1.0 + k}

    return OnlineCollection(schedule, OnlineLabelFile(label_path), SkipEveryThird(), FakeSampler(), task, [], [], 0, 1,
                            (16, 4), train)


def test_the_collection_requests_skips_trains_and_resumes_on_schedule(tmp_path):
    """4 updates of 16 episodes; l(n) = 8 + 32 * (1 - (1 - n/64)^2): 8, 22, 32, 38; points 8, 16, 24, 32."""
    trained: list = []
    online = collection(tmp_path / "labels.json", trained)
    model = None
    seen = []
    for update in range(4):
        model, _ = online.before_episode(update, FakePolicy(), (model, {}))
        seen.append((online.stats["online/labels"], online.stats["online/retrainings"], model))
        if update == 1:
            state = copy.deepcopy(online.state_dict())
    # requests (skipped ones not counted) reach l(n) + 2: 11 >= 10, 24 >= 24, 35 >= 34, 40 >= 40
    assert [s[0] for s in seen] == [11, 24, 35, 40]
    assert [s[1] for s in seen] == [1, 2, 4, 4] and seen[-1][2] == "model 3"
    assert trained == [(0, 8), (1, 16), (2, 24), (3, 32)]  # whole batches of 4 at each point
    assert online.stats["online/wait_time"] >= 0 and online.stats["online/pending"] == 0
    records = json.loads((tmp_path / "labels.json").read_text())
    assert len(records) == 40 and {r["best"] for r in records} == {0}
    assert [r["update"] for r in records].count(0) == 11

    # a resumed run from the checkpoint after update 1 (before update 2): the label file cut back to it, the last
    # training's model reloaded, then the same requests and trainings
    trained.clear()
    resumed = collection(tmp_path / "labels.json", trained)
    resumed.labeller.asked = 24 + 24 // 2  # the labeller's own count (36 asked, 12 skipped) as it stood
    resumed.load_state_dict(state)
    assert len(json.loads((tmp_path / "labels.json").read_text())) == 24
    model, hparams = resumed.before_episode(2, FakePolicy(), (None, {}))
    assert trained[0] == (1, 16) and trained[1:] == [(2, 24), (3, 32)]  # reloaded, then the due trainings
    resumed.before_episode(3, FakePolicy(), (model, hparams))
    assert json.loads((tmp_path / "labels.json").read_text()) == records


def test_under_torchrun_a_process_trains_only_once_it_reads_the_label_file_process_0_wrote(tmp_path, monkeypatch):
    """Before each training, process 1 reads the label file until it holds process 0's records (their count and hash,
    from process 0): a shared file system that shows the write late is looked at again, not trained on; one that
    never shows it is one line naming the file (here after 1 s instead of 30)."""
    import contextlib
    import threading
    from types import SimpleNamespace

    from lm_human_preference_details.online import collection as online_module

    label_file = tmp_path / "labels.json"
    records = [{"query": [1, 2], **{f"sample{i}": [i + 1] for i in range(4)}, "best": k % 4, "update": 0} for k in range(3)]
    label_file.write_text(json.dumps(records))
    written = len(records), hashlib.sha256(json.dumps(records).encode()).hexdigest()  # as process 0 has them
    label_file.write_text(json.dumps(records[:2]))  # what process 1 sees at first: the label file before the last batch
    process_1 = SimpleNamespace(world_size=2, is_main=False, from_main=lambda mine: written,
                                agree=contextlib.nullcontext)  # a failure is raised as it is
    later = threading.Timer(1.0, lambda: label_file.write_text(json.dumps(records)))
    later.start()
    online_module.check_shared_labels(process_1, online_module.OnlineLabelFile(label_file))
    assert json.loads(label_file.read_text()) == records  # it went on only once it read process 0's 3 records
    later.join()

    label_file.write_text(json.dumps(records[:2]))
    monkeypatch.setattr(online_module, "SHARED_DIR_WAIT_S", 1.0)
    with pytest.raises(UserError, match=f"{label_file} is not here as process 0 wrote it \\(3 records; here 2 records\\) "
                                        "after 1 s"):
        online_module.check_shared_labels(process_1, online_module.OnlineLabelFile(label_file))


def test_resume_refuses_other_options_before_writing_and_a_finished_run_resumes_to_its_end(online_run, tmp_path,
                                                                                          offline_cache):
    """On a copy of the finished run: --resume without its --online flags is refused before a reward model trains
    (no RUN/reward), as is an offline run resumed with --online flags (no online/ written); the finished run resumed
    with a changed --online.timeout (a fixed program may take longer) says so once and ends as it ended, its closing
    report made again with the last training's reward model. Seconds: a model load and the closing report."""
    from helpers.errors import assert_one_error_line
    from helpers.labelling import snapshot
    from helpers.processes import refused_in_process

    run_dir = tmp_path / "run"
    shutil.copytree(online_run, run_dir, symlinks=True)
    env = differing(environment(offline_cache))
    argv = policy_command(run_dir, "--resume")[2:]
    unlocked = lambda: {k: v for k, v in snapshot(run_dir).items() if k != LOCK}  # noqa: E731  (the lock names its pid)
    before = unlocked()
    offline_flags = [a for i, a in enumerate(argv) if not (a.startswith("--online.") or argv[i - 1].startswith("--online."))]
    result = refused_in_process("train_policy.py", offline_flags, run_dir.parent, env)
    assert_one_error_line(result, "cannot resume: this run's options differ from the checkpoint's (online.margin 12 -> "
                          "1000, online.num_labels 48 -> 0", alone=False)
    assert not (run_dir / "reward").exists() and unlocked() == before

    as_offline = tmp_path / "offline"  # an offline run's directory: its config.json says so, and it has no online/
    shutil.copytree(online_run, as_offline, symlinks=True)
    shutil.rmtree(as_offline / "online")
    config = json.loads((as_offline / "config.json").read_text())
    config["online"]["num_labels"] = 0
    (as_offline / "config.json").write_text(json.dumps(config))
    result = refused_in_process("train_policy.py", policy_command(as_offline, "--resume")[2:], as_offline.parent, env)
    assert_one_error_line(result, "online.num_labels 0 -> 48", alone=False)
    assert not (as_offline / "online").exists()

    summary = (run_dir / "summary.json").read_bytes()
    (run_dir / "summary.json").unlink()  # as a kill -9 in the closing report leaves it
    done = in_process("train_policy.py", *argv, "--online.timeout", "30", cwd=run_dir.parent, env_extra=env)
    said = done.stdout + done.stderr
    assert said.count("resumed with the online labeller's options changed: online.timeout 600.0 -> 30.0") == 1, said
    assert (run_dir / "summary.json").read_bytes() == summary
    assert (run_dir / "online" / "labels.json").read_bytes() == (online_run / "online" / "labels.json").read_bytes()


def test_a_file_where_an_online_training_runs_is_one_line_naming_it(tmp_path):
    """RUN/online/reward_01 a file: the line names that path, not an --output-dir the user never passed."""
    import train_policy

    (tmp_path / "reward_01").write_text("mine")
    assert train_policy.online_training_dir(tmp_path, 0) == tmp_path / "reward_00"
    with pytest.raises(UserError) as error:
        train_policy.online_training_dir(tmp_path, 1)
    assert str(error.value) == (f"{tmp_path / 'reward_01'} is not a directory; the run trains its online reward model 1 "
                                "there: move it away, then --resume the run")
