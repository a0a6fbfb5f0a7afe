"""labelling/online_labels.py: the online run's label file in OpenAI's schema, and its checks on resume."""

from __future__ import annotations

import json

import pytest

from lm_human_preference_details.labelling.answers import AnswerRecord, Request
from lm_human_preference_details.labelling.online_labels import OnlineLabelFile
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
