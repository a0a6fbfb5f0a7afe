"""online/answers.py: answers to the online collection's requests, and the waiting loop (online/collection.py): the
record is append-only and survives a torn line; PPO waits for an asynchronous labeller's labels, saying so once; a resumed
collection uses the recorded answers again and asks no labeller (the command labeller's program included) twice."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from helpers.online import FakePolicy, FakeSampler

from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.online import collection as online_module
from lm_human_preference_details.online.answers import UNKNOWN, AnswerRecord, Request
from lm_human_preference_details.online.collection import OnlineCollection
from lm_human_preference_details.online.label_file import OnlineLabelFile
from lm_human_preference_details.online.labellers import CommandLabeller
from lm_human_preference_details.online.schedule import Schedule
from lm_human_preference_details.utils.errors import UserError


def request(batch: int, position: int, token: int = 7) -> Request:
    return Request(batch, position, 0, [token, 1], [[token, i] for i in range(4)])


def test_the_record_appends_a_line_per_answer_and_drops_a_line_a_kill_cut_short(tmp_path):
    path = tmp_path / "answers.jsonl"
    log = AnswerRecord(path)
    log.record(request(0, 0), 2, "gold")
    first = path.read_bytes()
    log.record(request(0, 1), None, "gold")  # a skip is an answer too
    assert path.read_bytes().startswith(first) and path.read_bytes().count(b"\n") == 2  # appended, not rewritten
    log.close()
    with open(path, "ab") as f:
        f.write(b'{"key": "0/2", "ha')  # a kill in the middle of a line
    log = AnswerRecord(path)
    assert len(log) == 2 and log.get(request(0, 0)) == 2 and log.get(request(0, 1)) is None
    assert log.get(request(0, 2)) is UNKNOWN
    assert log.get(request(0, 0, token=8)) is UNKNOWN  # the same key, other tokens: not its answer
    log.record(request(0, 2), 3, "gold")
    log.close()
    assert [json.loads(line)["best"] for line in path.read_text().splitlines()] == [2, None, 3]


def test_a_record_changed_by_hand_is_one_line(tmp_path):
    (tmp_path / "answers.jsonl").write_text('{"key": "0/0", "hash": "x", "best": 1}\nnot json\n')
    with pytest.raises(UserError, match="answers.jsonl line 2 is not an answer this run recorded"):
        AnswerRecord(tmp_path / "answers.jsonl")


class SlowLabeller:
    """An asynchronous labeller: one answer per poll, every third a skip; counts what it was asked."""

    def __init__(self):
        self.queue: list[tuple[Request, object]] = []
        self.record = None
        self.asked: list[str] = []
        self.given = 0
        self.idle = 0

    def submit(self, requests, record, stop=lambda: None):
        self.record = record
        self.asked += [r.key for r in requests]
        self.queue += requests

    def poll(self, timeout=0.0):
        if not self.queue:  # nothing asked: a run that waits now would wait forever
            self.idle += 1
            assert self.idle < 100, "the run waits for labels it never asked for"
            return []
        r = self.queue.pop(0)
        best = None if self.given % 3 == 2 else 1
        self.given += 1
        self.record(r, best, "slow")  # durable before it is handed over, as the page does
        return [(r, best, "slow")]

    def waiting_for(self):
        return "the slow labeller"

    def close(self):
        pass


def collection(label_file: Path, labeller, said: list[str], stop_received=lambda: None) -> OnlineCollection:
    # l(n) = 8 + 32 * (1 - (1 - n/64)^2): 8, 22, 32, 38 before updates 0-3 of 16 episodes; margin 2
    schedule = Schedule(initial_labels=8, final_labels=40, total_episodes=64, margin=2, retrainings=0)
    task = SimpleNamespace(response_length=3, truncate_token=None, truncate_after=0)
    online = OnlineCollection(schedule, OnlineLabelFile(label_file), labeller, FakeSampler(), task, [], [], 0, 1, (16, 4),
                              lambda k, num_train: (f"model {k}", {}), say=said.append, stop_received=stop_received)
    return online


def test_ppo_waits_for_l_n_labels_from_a_labeller_that_answers_later(tmp_path, monkeypatch):
    monkeypatch.setattr(online_module, "PROGRESS_S", 0.0)  # a progress line at each look
    said: list[str] = []
    online = collection(tmp_path / "labels.json", SlowLabeller(), said)
    online.before_episode(0, FakePolicy(), (None, {}))
    # requests go out a batch of 4 at a time while requests < l(0) + 2 = 10: 12; PPO goes on at 8 labels, not before
    assert online.stats["online/labels"] == 8 and len(online.label_file) == 8
    # the labeller answered one request at each of the two looks between the three batches of requests
    assert said[0] == "online: PPO waits before episode 0 for 8 labels (2 so far) from the slow labeller"
    assert sum(line.startswith("online: PPO waits") for line in said) == 1 and said[-1].endswith("PPO goes on")
    assert any(line.startswith("online: 5 of 8 labels") for line in said)  # progress as labels arrive
    # 12 answers given for 8 labels: 4 skipped, each replaced by a new request (requests stay >= l(0) + 2)
    assert online.labeller.given == 12 and online.stats["online/requests"] >= 10
    assert online.stats["online/wait_time"] > 0
    online.before_episode(1, FakePolicy(), (None, {}))
    assert online.stats["online/labels"] == 22 and online.stats["online/pending"] == online.requests - 22


def test_a_resumed_collection_answers_from_the_record_and_asks_nothing_twice(tmp_path):
    """Checkpoint after update 0 with requests pending; answers given after it; then a 'kill' and a resume: the
    labels given after the checkpoint come back from the record, the labeller is asked only what it never answered."""
    first = SlowLabeller()
    online = collection(tmp_path / "labels.json", first, [])
    online.before_episode(0, FakePolicy(), (None, {}))
    state = copy.deepcopy(online.state_dict())
    assert state["pending"]  # requests out, not answered at the checkpoint
    online.before_episode(1, FakePolicy(), (None, {}))
    given = json.loads((tmp_path / "labels.json").read_text())  # 22 labels, 14 given after the checkpoint
    online.answers.close()

    second = SlowLabeller()
    resumed = collection(tmp_path / "labels.json", second, [])
    resumed.load_state_dict(state)
    resumed.before_episode(1, FakePolicy(), (None, {}))
    assert not set(second.asked) & set(first.asked[: first.given])  # nothing answered before is asked again
    label_file = json.loads((tmp_path / "labels.json").read_text())
    key = lambda r: json.dumps(r, sort_keys=True)  # noqa: E731
    assert {key(r) for r in given} <= {key(r) for r in label_file}  # every label given is still there
    assert len(label_file) >= 22  # l(16) = 22; answers from the record come in all at once


def test_the_command_labeller_is_not_asked_again_after_a_resume(tmp_path):
    log = tmp_path / "asked.jsonl"
    program = tmp_path / "judge.py"
    program.write_text(f"""import json, sys
for line in sys.stdin:
    open({str(log)!r}, "a").write(line)
    request = json.loads(line)
    print(request["id"], "skip" if request["query_tokens"][0] % 5 == 0 else 2, flush=True)
""")
    tokenizer = gpt2_tokenizer()
    command = f"{sys.executable} {program}"
    online = collection(tmp_path / "labels.json", CommandLabeller(command, tokenizer, timeout=60), [])
    online.before_episode(0, FakePolicy(), (None, {}))
    state = copy.deepcopy(online.state_dict())
    online.before_episode(1, FakePolicy(), (None, {}))
    asked_before = len(log.read_text().splitlines())
    given = (tmp_path / "labels.json").read_bytes()
    online.labeller.close()
    online.answers.close()

    resumed = collection(tmp_path / "labels.json", CommandLabeller(command, tokenizer, timeout=60), [])
    resumed.load_state_dict(state)
    resumed.before_episode(1, FakePolicy(), (None, {}))
    resumed.labeller.close()
    assert len(log.read_text().splitlines()) == asked_before  # every answer came from the record
    assert (tmp_path / "labels.json").read_bytes() == given


def test_a_run_killed_before_its_first_checkpoint_starts_again_without_doubling_its_label_file(tmp_path):
    first = SlowLabeller()
    online = collection(tmp_path / "labels.json", first, [])
    online.before_episode(0, FakePolicy(), (None, {}))
    given = json.loads((tmp_path / "labels.json").read_text())
    online.answers.close()  # killed: no checkpoint to resume from, so the run starts from its beginning

    second = SlowLabeller()
    again = collection(tmp_path / "labels.json", second, [])
    again.before_episode(0, FakePolicy(), (None, {}))
    label_file = json.loads((tmp_path / "labels.json").read_text())
    assert label_file[: len(given)] == given  # the same labels once, from the record, then those given now
    assert len(label_file) == len(given) + second.given - second.given // 3
    assert not set(second.asked) & set(first.asked[: first.given])


class NoAnswers(SlowLabeller):
    """Nobody labels: requests are taken, never answered."""

    def submit(self, requests, record, stop=lambda: None):
        self.asked += [r.key for r in requests]


def test_a_stop_signal_ends_a_wait_for_labels_at_once(tmp_path):
    import signal

    from lm_human_preference_details.utils.errors import Stopped

    said: list[str] = []
    looks = []
    online = collection(tmp_path / "labels.json", NoAnswers(), said,  # a stop from the wait's first line on
                        stop_received=lambda: (looks.append(1) or signal.SIGTERM) if said else None)
    with pytest.raises(Stopped, match="stopped by SIGTERM while PPO waited for labels before episode 0") as stopped:
        online.before_episode(0, FakePolicy(), (None, {}))
    assert stopped.value.exit_code == 128 + signal.SIGTERM and len(looks) == 1  # at the first look after the signal


def test_a_resumed_run_may_serve_its_page_elsewhere_or_ask_a_fixed_program_but_not_another_labeller():
    from lm_human_preference_details.run.identity import check_same_run

    saved = {"online": {"labeller": "page", "host": "127.0.0.1", "port": 8765, "command": None}}
    check_same_run(saved, {"online": {**saved["online"], "host": "0.0.0.0", "port": 0}})  # the port was taken since
    fixed = {"online": {**saved["online"], "labeller": "command", "command": "judge --fixed", "timeout": 60.0}}
    assert check_same_run({"online": {**fixed["online"], "command": "judge", "timeout": 5.0}}, fixed) == [
        "online.command 'judge' -> 'judge --fixed'", "online.timeout 5.0 -> 60.0"]  # the program fixed, as its line says
    with pytest.raises(UserError, match="cannot resume"):
        check_same_run(saved, {"online": {**saved["online"], "labeller": "command", "command": "judge"}})


def records(path: Path) -> list:
    return json.loads(path.read_text())


def answer_lines(path: Path) -> list:
    return [json.loads(line) for line in path.read_text().splitlines()]


def edit_best(best):
    """answers.jsonl with the first label's best replaced by ``best``."""
    def edit(online: Path) -> None:
        lines = answer_lines(online / "answers.jsonl")
        first = next(line for line in lines if line["best"] is not None)
        first["best"] = best
        (online / "answers.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return edit


def as_directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def as_file(path: Path) -> None:
    import shutil

    shutil.rmtree(path)
    path.write_text("mine")


# what was done to RUN/online after the checkpoint (8 labels, taken after update 0; 22 in the label file since) -> the
# file the resume's one line names, and what it says
DAMAGES = {
    "label file cut to its first 5": (lambda d: (d / "labels.json").write_text(json.dumps(records(d / "labels.json")[:5])),
                                   "labels.json holds 5 records, fewer than the checkpoint's 8"),
    "label file record 3 removed": (lambda d: (d / "labels.json").write_text(json.dumps(
        [r for i, r in enumerate(records(d / "labels.json")) if i != 3])), "labels.json differs from the checkpoint's 8"),
    "label file deleted": (lambda d: (d / "labels.json").unlink(), "labels.json holds 0 records, fewer than"),
    "label file emptied to []": (lambda d: (d / "labels.json").write_text("[]"), "labels.json holds 0 records, fewer than"),
    "label file cut mid-record": (lambda d: (d / "labels.json").write_bytes((d / "labels.json").read_bytes()[:300]),
                               "records, fewer than the checkpoint's 8"),  # the records before the cut kept
    "label file garbled": (lambda d: (d / "labels.json").write_bytes(b"[\n{garbled\n]\n"), "labels.json is not JSON"),
    "label file {}": (lambda d: (d / "labels.json").write_text("{}"), "labels.json is not a list of best-of-4 records"),
    "label file a directory": (lambda d: as_directory(d / "labels.json"), "labels.json is not a file"),
    "answers a directory": (lambda d: as_directory(d / "answers.jsonl"), "answers.jsonl is not a file"),
    "online a file": (lambda d: as_file(d), "online is not a directory"),
    "answers cut to 3 lines": (lambda d: (d / "answers.jsonl").write_text("".join(
        line + "\n" for line in (d / "answers.jsonl").read_text().splitlines()[:3])), "answers.jsonl has no answer for "
                                                                                        "record 2 of labels.json"),
    "answers best 7": (edit_best(7), "answers.jsonl line 1 is not an answer this run recorded"),
    "answers best '2'": (edit_best("2"), "answers.jsonl line 1 is not an answer this run recorded"),
}


@pytest.fixture(scope="module")
def checkpointed(tmp_path_factory) -> tuple[Path, dict]:
    """A collection's RUN/online past its checkpoint (after update 0: 8 labels; 22 after update 1) -> (the directory,
    the checkpoint's state)."""
    online_dir = tmp_path_factory.mktemp("run") / "online"
    online_dir.mkdir()
    online = collection(online_dir / "labels.json", SlowLabeller(), [])
    online.before_episode(0, FakePolicy(), (None, {}))
    state = copy.deepcopy(online.state_dict())
    online.before_episode(1, FakePolicy(), (None, {}))
    online.answers.close()
    return online_dir, state


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_label_file_or_record_damaged_after_the_checkpoint_is_one_line_on_resume(checkpointed, tmp_path, damage):
    """Cut, emptied, deleted, edited or replaced by a directory or a file: --resume says which file and how to recover,
    in one line, before the collection asks or trains anything; never a run that differs or waits for labels."""
    import shutil

    online_dir = tmp_path / "online"
    shutil.copytree(checkpointed[0], online_dir)
    do, message = DAMAGES[damage]
    do(online_dir)
    labeller = NoAnswers()
    with pytest.raises(UserError, match=re.escape(message)) as error:
        resumed = collection(online_dir / "labels.json", labeller, [])
        resumed.load_state_dict(copy.deepcopy(checkpointed[1]))
    assert "\n" not in str(error.value) and ("restore" in str(error.value) or "move it away" in str(error.value))
    assert not labeller.asked


def test_a_label_file_record_changed_is_found_without_the_checkpoints_hash(checkpointed, tmp_path):
    """A checkpoint of an older run holds no hash of its label file: each record is still checked against the answers."""
    import shutil

    online_dir = tmp_path / "online"
    shutil.copytree(checkpointed[0], online_dir)
    changed = records(online_dir / "labels.json")
    changed[2]["best"] = (changed[2]["best"] + 1) % 4
    (online_dir / "labels.json").write_text(json.dumps(changed))
    state = {k: v for k, v in copy.deepcopy(checkpointed[1]).items() if k != "labels_digest"}
    resumed = collection(online_dir / "labels.json", NoAnswers(), [])
    with pytest.raises(UserError, match="answers.jsonl has no answer for record 2 of labels.json"):
        resumed.load_state_dict(state)


def test_labels_that_cannot_come_are_one_line_not_a_wait(tmp_path):
    """The label file lost labels while the run waits for them, and every request is answered: nothing more can come."""
    online = collection(tmp_path / "labels.json", SlowLabeller(), [])
    online.before_episode(0, FakePolicy(), (None, {}))
    online.label_file.records = []
    with pytest.raises(UserError, match="holds .* labels and no request is open: the 22 PPO waits for cannot come"):
        online.before_episode(1, FakePolicy(), (None, {}))


class SkipsAll:
    """A labeller that skips every request at once (a judge that cannot decide): requests go out without end."""

    def __init__(self):
        self.asked = 0

    def submit(self, requests, record, stop=lambda: None):
        self.asked += len(requests)
        assert self.asked < 10_000, "requests went out without end: the stop was not looked at"
        self.given = [(r, None, "judge") for r in requests]
        for r in requests:
            record(r, None, "judge")

    def poll(self, timeout=0.0):
        given, self.given = getattr(self, "given", []), []
        return given

    def waiting_for(self):
        return "a labeller that skips all"

    def close(self):
        pass


def test_a_stop_ends_requests_that_go_out_without_end(tmp_path):
    """Every request skipped (or --online.margin 1000000): new ones go out while the request rule says so, and a stop
    signal ends that at its next batch, not after hundreds of answers."""
    import signal

    from lm_human_preference_details.utils.errors import Stopped

    labeller = SkipsAll()
    online = collection(tmp_path / "labels.json", labeller, [],
                        stop_received=lambda: signal.SIGTERM if labeller.asked >= 40 else None)
    with pytest.raises(Stopped, match="stopped by SIGTERM while requests went out before episode 0") as stopped:
        online.before_episode(0, FakePolicy(), (None, {}))
    assert stopped.value.exit_code == 128 + signal.SIGTERM and online.labeller.asked == 40  # at the next batch of 4
