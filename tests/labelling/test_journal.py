"""labelling/journal.py: a session's journal, replayed line by line, each line checked, a torn last line dropped."""

from __future__ import annotations

import json
import os
import threading

import pytest
from helpers.labelling import FLAGS, call, expected_file, fake_items, snapshot

from lm_human_preference_details.labelling import session as label_session
from lm_human_preference_details.labelling.journal import Decisions, journal_path
from lm_human_preference_details.labelling.server import LabelServer
from lm_human_preference_details.labelling.session import LabelSession
from lm_human_preference_details.utils.errors import UserError


def test_a_line_cut_by_a_kill_is_dropped_and_a_lagging_file_is_caught_up(tmp_path):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(4))
    session.label("a", 0, 1)
    session.close()
    journal = journal_path(out)
    # killed after journaling a choice and before rewriting the file, then half-way through journaling another
    with open(journal, "ab") as f:
        f.write(json.dumps({"event": "label", "item": 1, "best": 2, "client": "a"}).encode() + b"\n")
        f.write(b'{"event": "label", "item": 2, "be')
    again = LabelSession.resume(out, FLAGS)
    assert json.loads(out.read_text()) == expected_file({0: 1, 1: 2})
    assert journal.read_bytes().endswith(b"\n") and len(journal.read_text().splitlines()) == 3
    assert again.label("a", 2, 0)[0]
    assert json.loads(out.read_text()) == expected_file({0: 1, 1: 2, 2: 0})
    again.close()


def test_a_second_server_on_one_output_is_refused(tmp_path):
    session = LabelSession.create(tmp_path / "labels.json", FLAGS, fake_items(2))
    with pytest.raises(UserError, match="being labelled by another session"):
        LabelSession.resume(tmp_path / "labels.json", FLAGS)
    session.close()


def test_a_choice_the_disk_refuses_is_not_kept_and_the_session_goes_on(tmp_path, monkeypatch):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(3))
    server = LabelServer("127.0.0.1", 0)
    server.show(session)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    journal = journal_path(out).read_bytes()
    real_write = os.write

    def half_then_full(fd: int, data: bytes) -> int:  # the disk fills half-way through the journal's line
        real_write(fd, data[: len(data) // 2])
        raise OSError(28, "No space left on device")

    try:
        monkeypatch.setattr(label_session.os, "write", half_then_full)
        status, answer = call(server.url(), "/api/label", {"client": "a", "labeller": "ann", "item": 0, "best": 1})
        assert (status, journal_path(out).read_bytes(), out.read_text()) == (507, journal, "[]")
        assert "No space left on device" in answer["error"]
        monkeypatch.setattr(label_session.os, "write", real_write)
        assert call(server.url(), "/api/label", {"client": "a", "labeller": "ann", "item": 0, "best": 2})[0] == 200
    finally:
        server.shutdown()
        server.server_close()
        session.close()
    assert json.loads(out.read_text()) == expected_file({0: 2}, "ann")
    LabelSession.resume(out, FLAGS).close()  # the journal reads back whole


@pytest.mark.parametrize("line, number, why", [
    ("{}", 3, "not a label, skip or undo"),
    ('{"event": "undo", "item": 0, "client": "stranger"}', 3, "an undo of item 0 that client .stranger. did not decide last"),
    ('{"event": "label", "item": 1, "best": 0, "client": "a"}\n{"event": "undo", "item": 0, "client": "a"}', 4,
     "an undo of item 0 that client .a. did not decide last"),  # a's own choice, but not its last
    ('{"event": "undo", "item": 0, "client": "a", "labeller": "bob"}', 3,
     "an undo of item 0 that client .a. did not decide last as .bob."),  # a's last, but decided as anonymous
    ('{"event": "label", "item": 999, "best": 1, "client": "a"}', 3, "item 999 is not in 0..2"),
    ('{"event": "skip", "item": -1, "client": "a"}', 3, "item -1 is not in 0..2"),
    ('{"event": "label", "item": 1, "best": 7, "client": "a"}', 3, "best 7 is not in 0..3"),
    ('{"event": "label", "item": 0, "best": 1, "client": "a"}', 3, "labeller .anonymous. labelled item 0 already"),
    ('{"event": "label", "item": 0, "best": 1, "client": "b", "labeller": "bob"}', 3,
     r"item 0 has the 1 label\(s\) it wants already"),
    ('{"event": "skip", "item": 1, "client": "a"}\n{"event": "label", "item": 1, "best": 1, "client": "b"}', 4,
     "labeller .anonymous. skipped item 1 already"),  # another tab of the labeller who skipped it
    ('{"event": "label", "item": 1, "best": 1, "client": "a", "labeller": ""}', 3,
     "labeller must be a string of 1..64 printable characters"),
    ('{"event": "label", "item": NaN, "best": 1, "client": "a"}', 3, "not JSON"),
    ("header", 1, "no items"),
])
def test_a_journal_line_that_is_not_a_valid_event_is_one_line_naming_it(tmp_path, line, number, why):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(3))
    session.label("a", 0, 2)
    session.close()
    journal = journal_path(out)
    lines = journal.read_text().splitlines()
    if line == "header":
        lines[0] = json.dumps({**json.loads(lines[0]), "items": []})
    else:
        lines.append(line)
    journal.write_text("\n".join(lines) + "\n")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match=rf"line {number} is not an event this tool writes \({why}"):
        LabelSession.resume(out, FLAGS)
    assert snapshot(tmp_path) == before


def test_an_event_makes_new_decisions_and_leaves_those_before_it_as_they_were():
    """Decisions.after: a choice is applied only once its line is saved, so the decisions before it stay whole."""
    before = Decisions([1, 1, 1])
    before.apply({"event": "label", "item": 0, "best": 2, "client": "a"})  # a line without a name: anonymous's
    skipped = before.after({"event": "skip", "item": 1, "client": "a"})
    a = "anonymous"
    assert (before.labels, before.skipped, before.history) == ({0: [(a, 2)]}, {}, {"a": [(0, a)]})
    assert (skipped.labels, skipped.skipped, skipped.history) == ({0: [(a, 2)]}, {1: {a}}, {"a": [(0, a), (1, a)]})
    undone = skipped.after({"event": "undo", "item": 1, "client": "a"})
    assert (undone.labels, undone.skipped[1], undone.history) == ({0: [(a, 2)]}, set(), {"a": [(0, a)]})
    assert skipped.history == {"a": [(0, a), (1, a)]} and not skipped.is_open(1) and undone.is_open(1)
    again = {"event": "undo", "item": 1, "client": "a"}
    assert undone.problem(again) == "an undo of item 1 that client 'a' did not decide last as 'anonymous'"


KFLAGS = {**FLAGS, "labels_per_item": 2, "repeat_share": 0.5, "train_on": "majority"}


def test_k_labels_per_item_each_from_another_labeller_and_a_majority_with_ties_to_the_earliest(tmp_path):
    """--labels-per-item 2 --repeat-share 0.5 on 4 items: items 0 and 1 want 2 labels, items 2 and 3 one; a labeller
    labels an item once; majority with 2 labels that differ is a tie, settled by the earliest label."""
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, KFLAGS, fake_items(4))
    assert session.decisions.wants == [2, 2, 1, 1]
    assert session.label("t1", 0, 3, "ann")[0]
    assert not session.label("t2", 0, 1, "ann")[0]  # ann's other tab: ann labelled item 0 already
    assert session.state("t2", "ann")["item"]["index"] == 2  # item 1 is shown in ann's first tab
    assert session.state("t3", "bob")["item"]["index"] == 0  # item 0 still wants bob's label
    assert session.label("t3", 0, 1, "bob")[0]
    assert not session.label("t4", 0, 1, "cat")[0]  # item 0 has its 2 labels
    assert session.skip("t3", 1, "bob")[0] and session.label("t2", 1, 2, "ann")[0]
    # bob skipped item 1: not shown it again; item 2 wants one label and is shown in ann's tab t2, item 3 in cat's t4
    assert session.state("t3", "bob") | {"output": ""} == {
        "item": None, "labelled": 3, "skipped": 1, "wanted": 6, "leased": 2, "total": 4, "yours": 1, "can_undo": True,
        "output": ""}
    assert session.label("t4", 1, 2, "cat")[0] and session.label("t4", 2, 0, "cat")[0]
    records = json.loads(out.read_text())
    # item 0: ann 3, bob 1, a tie: ann's, the earliest; item 1: ann 2, cat 2; item 2: cat's one label
    assert [(r["best"], r["labeller"], r["labels"]) for r in records] == [
        (3, "ann", [{"labeller": "ann", "best": 3}, {"labeller": "bob", "best": 1}]),
        (2, "ann", [{"labeller": "ann", "best": 2}, {"labeller": "cat", "best": 2}]),
        (0, "cat", [{"labeller": "cat", "best": 0}])]
    assert session.undo("t3")[0] and session.decisions.skipped[1] == set()  # bob's skip taken back in bob's tab
    session.close()
    again = LabelSession.resume(out, KFLAGS)  # the journal replays all of it
    assert again.decisions.labels == {0: [("ann", 3), ("bob", 1)], 1: [("ann", 2), ("cat", 2)], 2: [("cat", 0)]}
    assert again.progress_line() == "5 of 6 labels given, 0 skipped"
    again.close()
    with pytest.raises(UserError, match="made with train_on='majority'"):  # a session continues with its flags only
        LabelSession.resume(out, {**KFLAGS, "train_on": "first"})


def test_majority_ties_go_to_the_earliest_label_among_the_tied_samples():
    from lm_human_preference_details.labelling.journal import training_label

    labels = [("a", 1), ("b", 2), ("c", 2), ("d", 1), ("e", 0)]  # 1 and 2 tie at two: a's 1 came first
    assert training_label(labels, "majority") == ("a", 1)
    assert training_label(labels[1:], "majority") == ("b", 2)  # 2 (b, c) and 1 (d) : 2
    assert training_label([("a", 0), ("b", 3), ("c", 3)], "majority") == ("b", 3)  # the majority, not the first
    assert training_label([("a", 0), ("b", 3), ("c", 3)], "first") == ("a", 0)


@pytest.mark.parametrize("line, why", [
    ('{"event": "label", "item": 0, "best": 1, "client": "b", "labeller": "ann"}', "labeller .ann. labelled item 0 already"),
    ('{"event": "label", "item": 0, "best": 1, "client": "c", "labeller": "cat"}', r"item 0 has the 2 label\(s\) it wants"),
    ('{"event": "label", "item": 2, "best": 1, "client": "c", "labeller": "cat"}', r"item 2 has the 1 label\(s\) it wants"),
])
def test_a_journal_label_past_k_or_a_second_by_one_labeller_is_one_line_naming_it(tmp_path, line, why):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, KFLAGS, fake_items(4))
    session.label("a", 0, 1, "ann"), session.label("b", 0, 2, "bob"), session.label("b", 2, 0, "bob")
    session.close()
    with open(journal_path(out), "a") as f:
        f.write(line + "\n")
    with pytest.raises(UserError, match=rf"line 5 is not an event this tool writes \({why}"):
        LabelSession.resume(out, KFLAGS)


def test_a_journal_written_before_names_and_k_continues_as_anonymous(tmp_path):
    """A version-1 journal of before: no labeller in its lines, no labels_per_item in its flags; it continues with the
    flags' defaults, each label anonymous's."""
    out = tmp_path / "labels.json"
    header = {"lmhp_label_session": 1, "output": "labels.json", "flags": FLAGS, "items": fake_items(3)}
    lines = [header, {"event": "label", "item": 0, "best": 2, "client": "a"}, {"event": "skip", "item": 1, "client": "a"}]
    journal_path(out).write_text("".join(json.dumps(line) + "\n" for line in lines))
    out.write_text(json.dumps([{"query": [0, 0, 50259], **{f"sample{j}": [j, 50259] for j in range(4)}, "best": 2}]))
    session = LabelSession.resume(out, {**FLAGS, "labels_per_item": 1, "repeat_share": 1.0, "train_on": "first"})
    assert json.loads(out.read_text()) == expected_file({0: 2})  # rewritten with the labeller, from the journal
    assert session.state("a")["item"]["index"] == 2 and session.undo("a")[0]
    session.close()
