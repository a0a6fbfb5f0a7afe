"""online/label_file.py: the online run's label file in OpenAI's schema, and its checks on resume."""

from __future__ import annotations

import json

import pytest

from lm_human_preference_details.online.answers import AnswerRecord, Request
from lm_human_preference_details.online.label_file import OnlineLabelFile
from lm_human_preference_details.utils.errors import UserError

PAD = 50257  # the run's pad; OpenAI's files pad with 50259


def request(i: int) -> Request:
    return Request(0, i, 3, [10 + i, PAD], [[20 + i, PAD], [30 + i, 31], [40, 41], [50, 51]])


def test_answers_are_written_in_openais_schema_and_a_skip_is_no_record(tmp_path):
    labels = OnlineLabelFile(tmp_path / "labels.json")
    labels.add([(request(0), 2, "gold"), (request(1), None, "gold"), (request(2), 0, "ann")], PAD)
    written = json.loads((tmp_path / "labels.json").read_text())
    assert written == [{"query": [10, 50259], "sample0": [20, 50259], "sample1": [30, 31], "sample2": [40, 41],
                        "sample3": [50, 51], "best": 2, "update": 3, "labeller": "gold"},
                       {"query": [12, 50259], "sample0": [22, 50259], "sample1": [32, 31], "sample2": [40, 41],
                        "sample3": [50, 51], "best": 0, "update": 3, "labeller": "ann"}]
    assert OnlineLabelFile(tmp_path / "labels.json").records == written  # read back as written
    labels.keep(1)
    assert json.loads((tmp_path / "labels.json").read_text()) == written[:1]


@pytest.mark.parametrize("damage, message", [
    (lambda p: p.mkdir(), "is not a file"),
    (lambda p: p.write_text('[{"query": [1]'), "is not JSON"),
    (lambda p: p.write_text("{}"), "is not a list of best-of-4 records"),
    (lambda p: p.write_text('[{"best": 7}]'), "is not a list of best-of-4 records"),
    (lambda p: p.write_text('[{"best": "2"}]'), "is not a list of best-of-4 records"),
])
def test_a_file_that_is_not_the_runs_is_one_line_naming_it(tmp_path, damage, message):
    path = tmp_path / "labels.json"
    damage(path)
    with pytest.raises(UserError) as e:
        OnlineLabelFile(path)
    assert str(e.value).startswith(f"{path} {message}") and "--overwrite" in str(e.value) and "\n" not in str(e.value)


def test_a_resume_finds_the_file_cut_changed_or_without_its_answers(tmp_path):
    answers = AnswerRecord(tmp_path / "answers.jsonl")
    for i, best in ((0, 2), (1, 1)):
        answers.record(request(i), best, "gold")
    labels = OnlineLabelFile(tmp_path / "labels.json")
    labels.add([(request(0), 2, "gold"), (request(1), 1, "gold")], PAD)
    digest = labels.digest(2)
    labels.check_resumed(2, digest, answers, PAD)  # as saved: nothing to say
    with pytest.raises(UserError, match="holds 2 records, fewer than the checkpoint's 3"):
        labels.check_resumed(3, None, answers, PAD)
    labels.records[1]["best"] = 0  # edited by hand
    with pytest.raises(UserError, match="differs from the checkpoint's 2"):
        labels.check_resumed(2, digest, answers, PAD)
    with pytest.raises(UserError, match="has no answer for record 1 of labels.json"):
        labels.check_resumed(2, None, answers, PAD)  # an older checkpoint without the hash: the answers still say


def test_answers_are_appended_one_record_a_line_and_the_file_stays_a_json_list(tmp_path):
    path = tmp_path / "labels.json"
    labels = OnlineLabelFile(path)
    labels.add([(request(0), 2, "ann")], PAD)
    first, inode = path.read_bytes(), path.stat().st_ino
    labels.add([(request(1), 1, "ann"), (request(2), None, "ann"), (request(3), 3, "ann")], PAD)
    data = path.read_bytes()
    # appended in place: the same file, its first record's line as it was, then one record a line
    assert path.stat().st_ino == inode and data.startswith(first[:-len(b"\n]\n")])
    lines = data.decode().split("\n")
    assert lines[0] == "[" and lines[-2:] == ["]", ""] and len(lines) == 3 + 3
    assert [json.loads(line.rstrip(","))["best"] for line in lines[1:-2]] == [2, 1, 3]
    assert json.loads(data) == labels.records and [r["query"][0] for r in labels.records] == [10, 11, 13]
    labels.keep(2)  # cut back in place, then grown again
    assert json.loads(path.read_bytes()) == labels.records and len(labels) == 2
    assert path.read_text().count("\n") == 2 + 2  # still one record a line: "[", two records, "]"
    labels.add([(request(4), 0, "ann")], PAD)
    assert [r["query"][0] for r in json.loads(path.read_bytes())] == [10, 11, 14]
    assert OnlineLabelFile(path).records == labels.records
    labels.keep(0)
    assert path.read_bytes() == b"[\n]\n" and OnlineLabelFile(path).records == []


@pytest.mark.parametrize("cut, kept", [(1, 2), (2, 2), (10, 2), (-4, 3), (-3, 4), (-2, 4), (-1, 4)])
def test_an_append_torn_by_a_power_cut_loses_only_that_write(tmp_path, cut, kept):
    path = tmp_path / "labels.json"
    labels = OnlineLabelFile(path)
    labels.add([(request(0), 2, "ann"), (request(1), 1, "ann")], PAD)
    before = path.read_bytes()
    labels.add([(request(2), 0, "ann"), (request(3), 3, "ann")], PAD)
    after = path.read_bytes()
    start = len(before) - len(b"\n]\n")  # the last write began here: cut it short at `cut` bytes from either end
    path.write_bytes(after[:start + cut] if cut > 0 else after[:cut])
    survived = OnlineLabelFile(path)
    assert survived.records == labels.records[:kept]
    assert json.loads(path.read_bytes()) == survived.records  # a whole list again, and appended to as before
    survived.add([(request(5), 1, "ann")], PAD)
    assert json.loads(path.read_bytes())[-1]["query"][0] == 15


def test_an_older_runs_one_line_file_is_read_and_laid_out_again(tmp_path):
    path = tmp_path / "labels.json"
    OnlineLabelFile(path).add([(request(0), 2, "ann"), (request(1), 1, "ann")], PAD)
    records = json.loads(path.read_bytes())
    path.write_text(json.dumps(records))  # as the run wrote it before it appended
    labels = OnlineLabelFile(path)
    assert labels.records == records and path.read_text().count("\n") == 4
    labels.add([(request(2), 3, "ann")], PAD)
    assert json.loads(path.read_bytes()) == records + [labels.records[-1]]


def test_a_file_damaged_past_its_last_whole_record_is_refused(tmp_path):
    path = tmp_path / "labels.json"
    OnlineLabelFile(path).add([(request(0), 2, "ann")], PAD)
    path.write_bytes(path.read_bytes()[:-3] + b",\ngarbage\nmore\n")  # not one torn line: changed
    with pytest.raises(UserError, match="is not JSON"):
        OnlineLabelFile(path)


def test_a_reader_that_is_not_the_owner_never_writes_the_file(tmp_path):
    path = tmp_path / "labels.json"
    OnlineLabelFile(path).add([(request(0), 2, "ann"), (request(1), 1, "ann")], PAD)
    data = path.read_bytes()
    for damaged in (data[:-5], json.dumps(json.loads(data)).encode()):  # an append torn (or under way); an old layout
        path.write_bytes(damaged)
        seen = OnlineLabelFile(path, owner=False)  # under torchrun, a process that is not process 0
        assert path.read_bytes() == damaged  # read as it is, never laid out again or cut back
        assert [r["best"] for r in seen.records] == ([2] if damaged == data[:-5] else [2, 1])
