"""label.py and labelling/session.py: the label file and its journal, two tabs at once, the items, kill -9 of the real
server, bad input. The page itself, in a real browser: e2e/test_label_page.py."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
from pathlib import Path

import pytest
import torch
from helpers.errors import assert_one_error_line
from helpers.labelling import (
    FLAGS,
    RESPONSE_LENGTH,
    call,
    expected_file,
    fake_items,
    journal_items,
    label_command,
    read_labels,
    start_server,
    tiny_offline_cache,
)
from helpers.processes import refused_in_process

from lm_human_preference_details import label
from lm_human_preference_details.cli.parsing import parse_args
from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.labelling.journal import journal_path
from lm_human_preference_details.labelling.session import LabelSession
from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.checks import check_output_dir
from lm_human_preference_details.utils.errors import UserError


@pytest.fixture(scope="module")
def cache(assets, tmp_path_factory):
    return tiny_offline_cache(tmp_path_factory.mktemp("label_cache"), assets)


# ------------------------------------------------------------------ the session: file, journal, resume
def test_choices_are_journaled_and_written_as_openai_records(tmp_path):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(5))
    assert json.loads(out.read_text()) == []
    assert session.state("a")["item"]["index"] == 0
    assert session.label("a", 0, 2)[0]
    assert session.state("a")["item"]["index"] == 1
    assert session.skip("a", 1)[0]
    assert session.label("a", 2, 3)[0]
    assert session.undo("a")[1]["item"]["index"] == 2  # the undone item comes back to the tab that undid it
    assert session.label("a", 2, 1)[0]
    assert json.loads(out.read_text()) == expected_file({0: 2, 2: 1})
    events = [json.loads(line) for line in journal_path(out).read_text().splitlines()[1:]]
    assert [(e["event"], e["item"]) for e in events] == [("label", 0), ("skip", 1), ("label", 2), ("undo", 2),
                                                        ("label", 2)]
    state = session.state("a")
    assert (state["item"]["index"], state["labelled"], state["skipped"], state["total"]) == (3, 2, 1, 5)
    session.close()


def test_undo_takes_back_only_the_tabs_own_choices(tmp_path):
    session = LabelSession.create(tmp_path / "labels.json", FLAGS, fake_items(4))
    session.label("a", 0, 0)
    session.label("b", 1, 1)
    undone, state = session.undo("a")
    assert undone and state["item"]["index"] == 0
    assert json.loads((tmp_path / "labels.json").read_text()) == expected_file({1: 1})
    assert session.undo("a")[0] is False  # a has nothing left to undo; b's label stays
    assert json.loads((tmp_path / "labels.json").read_text()) == expected_file({1: 1})
    session.close()


def test_a_resumed_session_continues_at_the_first_open_item(tmp_path):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(6))
    for item, best in ((0, 1), (1, 3), (2, 0)):
        session.label("a", item, best)
    session.skip("a", 3)
    session.close()
    again = LabelSession.resume(out, FLAGS)
    state = again.state("new tab")
    assert (state["item"]["index"], state["labelled"], state["skipped"]) == (4, 3, 1)
    assert state["item"]["samples"] == ["s4.0", "s4.1", "s4.2", "s4.3"]
    assert again.undo("a")[1]["item"]["index"] == 3  # the journal keeps each tab's choices: undo works after a restart
    again.close()


@pytest.mark.parametrize("case", ["user file", "changed by the user", "another output's journal", "not a journal",
                                  "other flags", "a directory"])
def test_files_that_are_not_this_sessions_are_never_written(tmp_path, case):
    out = tmp_path / "labels.json"
    if case == "user file":
        out.write_text("my notes")
    elif case == "a directory":
        out.mkdir()
    else:
        LabelSession.create(tmp_path / "other.json" if case == "another output's journal" else out, FLAGS,
                            fake_items(3)).close()
        if case == "changed by the user":
            out.write_text("[]\n")
        elif case == "another output's journal":
            os.replace(journal_path(tmp_path / "other.json"), journal_path(out))
        elif case == "not a journal":
            journal_path(out).write_text('{"mine": 1}\n')
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    flags = {**FLAGS, "seed": 2} if case == "other flags" else FLAGS
    expected = {"user file": "no labelling session wrote it", "changed by the user": "was changed since",
                "another output's journal": "is the journal of other.json", "not a journal": "is not a labelling session",
                "other flags": "seed=1", "a directory": "is a directory"}[case]
    with pytest.raises(UserError, match=expected):
        LabelSession.resume(out, flags)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()} == before


def test_an_output_inside_a_file_is_refused_before_anything_is_sampled(tmp_path):
    (tmp_path / "notes").write_text("mine")
    with pytest.raises(UserError, match="is not a writable directory"):
        LabelSession.resume(tmp_path / "notes" / "labels.json", FLAGS)
    assert [p.name for p in tmp_path.iterdir()] == ["notes"] and (tmp_path / "notes").read_text() == "mine"


def test_an_output_where_nothing_can_be_written_is_refused_although_os_access_says_yes(monkeypatch):
    """/proc takes no new entry, even from root, to whom os.access says yes (made to say so for every user here): the
    label tool probes as the run's --output-dir check does."""
    monkeypatch.setattr(os, "access", lambda *args, **kwargs: True)
    with pytest.raises(UserError, match="/proc is not a writable directory"):
        LabelSession.resume(Path("/proc/lmhp-labels/labels.json"), FLAGS)
    with pytest.raises(UserError, match="cannot be written"):
        check_output_dir("/proc/lmhp-labels")


# ------------------------------------------------------------------ two tabs at once
def test_two_tabs_never_label_one_item_twice(tmp_path):
    out = tmp_path / "labels.json"
    session = LabelSession.create(out, FLAGS, fake_items(30))
    server = label.LabelServer("127.0.0.1", 0)
    server.show(session)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    url = server.url()
    try:
        # both tabs are shown an item, then both choose for the first one: one choice is kept, the other refused
        first = [call(url, f"/api/state?client={c}")[1]["item"]["index"] for c in "ab"]
        assert first == [0, 1]  # two tabs are shown two items
        statuses = sorted(call(url, "/api/label", {"client": c, "labeller": "ann", "item": 0, "best": b})[0]
                          for c, b in (("a", 1), ("b", 2)))
        assert statuses == [200, 409]
        shown = {c: [] for c in "ab"}

        def tab(client: str) -> None:  # labels what it is shown until nothing is left (bounded)
            for _ in range(60):
                item = call(url, f"/api/state?client={client}")[1]["item"]
                if item is None:
                    return
                shown[client].append(item["index"])
                call(url, "/api/label", {"client": client, "labeller": "ann", "item": item["index"],
                                         "best": item["index"] % 4})

        tabs = [threading.Thread(target=tab, args=(c,)) for c in "ab"]
        for t in tabs:
            t.start()
        for t in tabs:
            t.join()
    finally:
        server.shutdown()
        server.server_close()
        session.close()
    events = [json.loads(line) for line in journal_path(out).read_text().splitlines()[1:]]
    items = [e["item"] for e in events if e["event"] == "label"]
    assert sorted(items) == list(range(30))  # every item labelled, none twice
    assert shown["a"] and shown["b"]
    records = json.loads(out.read_text())
    assert [r["query"][0] for r in records] == list(range(30))
    assert records[0]["best"] in (1, 2) and all(r["best"] == r["query"][0] % 4 for r in records[1:])


# ------------------------------------------------------------------ the items: the task's sampling, fixed by the seed
def test_the_items_are_fixed_by_the_seed(cache, monkeypatch):
    monkeypatch.setattr(files, "CACHE_DIR", cache)
    args = parse_args(label.build_args, "", ["--task", "offline", "--num-queries", "3", "--output", "x.json"]).finalize()
    items = label.sample_items(args, torch.device("cpu"))
    assert items == label.sample_items(args, torch.device("cpu"))  # the seed fixes them
    assert [len(item["query"]) for item in items] == [args.task.query_length] * 3
    assert [len(s) for item in items for s in item["samples"]] == [RESPONSE_LENGTH] * 12
    other = parse_args(label.build_args, "", ["--task", "offline", "--num-queries", "3", "--seed", "2"]).finalize()
    assert label.sample_items(other, torch.device("cpu")) != items


class ScriptedPolicy:
    """A policy whose every response is 24 tokens of 200 + row, with '.' (13) at index 5 and, in even rows, 17."""

    def sample(self, contexts: torch.Tensor, length: int, generator=None) -> dict[str, torch.Tensor]:
        responses = 200 + torch.arange(len(contexts)).unsqueeze(1).repeat(1, length)  # [b, length]
        responses[:, 5] = 13
        responses[::2, 17] = 13
        return {"responses": responses}


def test_samples_are_cut_as_ppo_scores_them_and_padded_with_50259(cache, monkeypatch):
    monkeypatch.setattr(files, "CACHE_DIR", cache)
    monkeypatch.setattr(label, "load_policy", lambda *a: (ScriptedPolicy(), None))
    args = parse_args(label.build_args, "", ["--task", "offline", "--num-queries", "2", "--output", "x.json"]).finalize()
    items = label.sample_items(args, torch.device("cpu"))
    rows = [s for item in items for s in item["samples"]]  # 8 responses, rows 0..7
    for row, sample in enumerate(rows):
        tokens = [200 + row] * 24
        tokens[5] = 13
        if row % 2 == 0:  # E2 truncate and score: cut after the '.' at index 17 >= truncate_after 16, not the one at 5
            tokens[17] = 13
            tokens[18:] = [OAI_PAD] * 6  # A2 label pads: 50259 in the file, as OpenAI's
        assert sample == tokens
    assert items[0]["sample_texts"][0].endswith(".") and items[0]["query_text"]


# ------------------------------------------------------------------ the server as users run it
def test_kill_9_loses_no_label_and_a_restart_shows_the_same_items(cache, tmp_path):
    out = tmp_path / "labels.json"
    proc, url, lines = start_server(cache, out)
    try:
        assert url.startswith("http://127.0.0.1:") and "only this machine can open it" in lines[-1]
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        with pytest.raises(OSError):  # the default: 127.0.0.1 only, not the machine's other loopback addresses
            socket.create_connection(("127.0.0.2", port), timeout=10).close()
        shown = []
        for best in (2, 0, 3):
            item = call(url, "/api/state?client=a")[1]["item"]
            shown.append(item)
            assert call(url, "/api/label", {"client": "a", "labeller": "ann", "item": item["index"], "best": best})[0] == 200
        fourth = call(url, "/api/state?client=a")[1]["item"]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    records = read_labels(out)  # parses, as --labels.source reads it
    items = journal_items(out)
    assert [r["best"] for r in records] == [2, 0, 3]
    assert [r["query"] for r in records] == [items[i]["query"] for i in range(3)]
    assert [[r[f"sample{j}"] for j in range(4)] for r in records] == [items[i]["samples"] for i in range(3)]

    # a restart, here served on every address: it says so, and continues at the first unlabelled item
    proc, url, lines = start_server(cache, out, "--host", "0.0.0.0")
    try:
        assert "3 of 8 items labelled" in "\n".join(lines)
        assert "anyone who can reach this machine" in lines[-1]
        port = int(url.rstrip("/").rsplit(":", 1)[1])
        state = call(f"http://127.0.0.2:{port}", "/api/state?client=b")[1]
        assert state["item"] == fourth and state["labelled"] == 3
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert "stopped: 3 of 8 items labelled" in proc.stdout.read()
    assert journal_items(out) == items


@pytest.mark.parametrize("field, value, message", [
    ("output", "  ", "--output is empty; pass the path of the label file to write"),
    ("port", -1, "--port -1 is not a TCP port; pass 1..65535, or 0 for any free port"),
    ("port", 65536, "--port 65536 is not a TCP port; pass 1..65535, or 0 for any free port"),
    ("host", "", "--host is empty; pass an address of this machine"),  # never every interface
], ids=["empty-output", "port-minus-1", "port-65536", "empty-host"])
def test_an_empty_output_or_a_port_outside_0_to_65535_is_one_line(field, value, message):
    args = label.build_args("offline")
    setattr(args, field, value)
    with pytest.raises(UserError, match=re.escape(message)):
        args.finalize()


def test_bad_input_is_one_line_and_writes_nothing(cache, tmp_path):
    """Each case as `python -m lm_human_preference_details.label` would end it, in this process
    (helpers.processes.refused_in_process, with the label tool's cache); test_label_promises runs a real one."""
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = str(taken.getsockname()[1])
    (tmp_path / "mine.json").write_text("my own notes")
    cases = [
        (["--output", "mine.json"], "--output mine.json exists and no labelling session wrote it"),
        (["--port", port], f"--port {port} is in use on 127.0.0.1"),
        (["--task.query-dataset", "gone.txt"], "--task.query-dataset gone.txt is neither"),
        (["--num-queries", "0"], "--num-queries"),
    ]
    try:
        results = [refused_in_process("lm_human_preference_details.label", label_command(tmp_path / "new.json",
                                      *extra)[3:], tmp_path, {"LMHP_CACHE": cache}) for extra, _ in cases]
        for (_, message), result in zip(cases, results):
            assert_one_error_line(result, message)
            assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.json"]
    finally:
        taken.close()
    assert (tmp_path / "mine.json").read_text() == "my own notes"
