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
    server.session = session
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
