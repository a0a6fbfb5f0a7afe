"""online/page.py: the labelling page served from the run, over its requests: tabs shown different requests, none
answered twice, a page from before a resume refused where its index names another request, a full disk never a label."""

from __future__ import annotations

import errno
import json
from types import SimpleNamespace

from helpers.labelling import call

from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.online import answers as online_answers
from lm_human_preference_details.online.answers import UNKNOWN, AnswerRecord, Request
from lm_human_preference_details.online.page import OnlineSession, PageLabeller


def request(batch: int, position: int, token: int = 7) -> Request:
    return Request(batch, position, 0, [token, 1], [[token, i] for i in range(4)])


def test_two_tabs_are_shown_different_requests_and_none_is_answered_twice(tmp_path):
    task = SimpleNamespace(query_prefix="", query_suffix="")
    session = OnlineSession(gpt2_tokenizer(), task, tmp_path / "answers.jsonl")
    log = AnswerRecord(tmp_path / "answers.jsonl")
    session.add([request(0, 0), request(0, 1)], log.record)
    a, b = session.state("tab a")["item"]["index"], session.state("tab b")["item"]["index"]
    assert {a, b} == {0, 1}  # each tab its own request
    assert session.label("tab a", a, 3, "ann")[0] and not session.label("tab b", a, 1, "bob")[0]  # the second is refused
    assert session.skip("tab b", b, "bob")[0] and session.state("tab a", "ann")["item"] is None
    assert not session.undo("tab a", "ann")[0]  # final: the run may have trained on it
    assert session.take(0) == [(request(0, a), 3, "ann"), (request(0, b), None, "bob")]  # each with who gave it
    assert log.get(request(0, a)) == 3 and log.get(request(0, b)) is None  # recorded before they were acknowledged
    assert [json.loads(line)["labeller"] for line in (tmp_path / "answers.jsonl").read_text().splitlines()] == ["ann", "bob"]
    assert AnswerRecord(tmp_path / "answers.jsonl").labeller(request(0, a)) == "ann"  # read back


def test_a_page_shown_before_a_resume_is_refused_where_its_index_now_names_another_request(tmp_path):
    """Through the page's HTTP calls: tab b shows request 0/1 at index 1; tab a answers 0/0; the run is killed and
    resumed, and the resumed page lists only the open requests, 0/1 at index 0 and 0/2 at index 1. Tab b's click on
    index 1 names 0/1: refused (409, the page reloads), nothing recorded; reloaded, its click lands on 0/1."""

    task, tokenizer, path = SimpleNamespace(query_prefix="", query_suffix=""), gpt2_tokenizer(), tmp_path / "answers.jsonl"
    made = [request(0, 0, token=7), request(0, 1, token=8), request(0, 2, token=9)]
    log, before = AnswerRecord(path), PageLabeller("127.0.0.1", 0, tokenizer, task, path)
    before.submit(made, log.record)
    url = before.server.url()
    a = call(url, "/api/state?client=a")[1]["item"]
    b = call(url, "/api/state?client=b")[1]["item"]
    assert (a["index"], b["index"]) == (0, 1)
    assert call(url, "/api/label", {"client": "a", "labeller": "ann", "item": 0, "request": a["request"], "best": 3})[0] == 200
    before.close(), log.close()  # killed, then resumed: the open requests submitted again, in order

    log, after = AnswerRecord(path), PageLabeller("127.0.0.1", 0, tokenizer, task, path)
    after.submit(made[1:], log.record)
    url = after.server.url()
    for stale in ({"item": 1, "request": b["request"]}, {"item": 5, "request": b["request"]}):  # 0/2 now; past the items
        status, answer = call(url, "/api/label", {"client": "b", "labeller": "ann", **stale, "best": 2})
        assert status == 409 and answer["reload"] and not answer["kept"], answer
    assert log.get(made[1]) is UNKNOWN and log.get(made[2]) is UNKNOWN and after.poll() == []
    reloaded = call(url, "/api/state?client=b")[1]["item"]
    assert (reloaded["index"], reloaded["request"]) == (0, b["request"])  # the same request, at its new index
    assert call(url, "/api/label", {"client": "b", "labeller": "ann", "item": 0, "request": b["request"], "best": 2})[0] == 200
    assert after.poll() == [(made[1], 2, "ann")] and log.get(made[1]) == 2 and log.get(made[2]) is UNKNOWN
    after.close(), log.close()


def test_a_choice_refused_for_a_full_disk_is_never_a_label_after_a_resume(tmp_path, monkeypatch):
    """Through the page's HTTP calls: two choices refused (507, "not kept") while the disk is full (the line written,
    its fsync failing, as a full disk does), then a kill and a resume: neither is an answer; the requests are asked
    again, and a choice made once there is space is kept."""

    task, path = SimpleNamespace(query_prefix="", query_suffix=""), tmp_path / "answers.jsonl"
    made = [request(0, 0, token=7), request(0, 1, token=8), request(0, 2, token=9)]
    log, page = AnswerRecord(path), PageLabeller("127.0.0.1", 0, gpt2_tokenizer(), task, path)
    page.submit(made, log.record)
    url = page.server.url()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(online_answers.os, "fsync", full)
    for client in ("a", "b"):
        item = call(url, f"/api/state?client={client}")[1]["item"]
        status, answer = call(url, "/api/label", {"client": client, "labeller": "ann", "item": item["index"],
                                                  "request": item["request"], "best": 1})
        assert status == 507 and not answer["kept"], answer
    monkeypatch.undo()
    item = call(url, "/api/state?client=c")[1]["item"]
    chosen = {"client": "c", "labeller": "ann", "item": item["index"], "request": item["request"], "best": 2}
    assert call(url, "/api/label", chosen)[0] == 200
    page.close(), log.close()  # killed, then resumed
    resumed = AnswerRecord(path)
    assert [resumed.get(r) for r in made] == [UNKNOWN, UNKNOWN, 2] and len(path.read_text().splitlines()) == 1
