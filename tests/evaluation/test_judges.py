"""evaluation/judges.py: the gold scorer as a judge of two responses, and programs asked only for the labels the
session still wants, each journaled as it is given."""

from __future__ import annotations

import torch

from lm_human_preference_details.evaluation.judges import gold_answer, label_by_program, names
from lm_human_preference_details.labelling.session import LabelSession

FLAGS = {"labels_per_item": 3, "repeat_share": 1.0, "train_on": "majority", "samples_per_item": 2}


def items(n: int) -> list[dict]:
    return [{"query": [1, 2], "samples": [[3, i], [4, i]], "query_text": f"q{i}", "sample_texts": ["a", "b"],
             "policies": ["p", "q"], "query_index": i} for i in range(n)]


def test_names_of_k_labels():
    assert names("gold", 1) == ["gold"] and names("judge.py", 3) == ["judge.py#1", "judge.py#2", "judge.py#3"]


def test_gold_picks_the_higher_score_and_skips_a_tie(tokenizer):
    scores = iter([[0.5, 1.0], [2.0, -1.0], [0.3, 0.3]])
    gold = gold_answer(lambda tok, responses: torch.tensor(next(scores)), tokenizer)
    assert [gold(item) for item in items(3)] == [1, 0, None]  # a tie never goes to the left one


def test_a_program_is_asked_only_what_the_session_still_wants(tmp_path):
    session = LabelSession.create(tmp_path / "comparisons.json", FLAGS, items(2))
    session.label("page", 0, 1, "judge#1")  # given before a stop
    asked = []

    def answer(item: dict):
        asked.append(item["query_text"])
        return None if item["query_text"] == "q1" else 0

    label_by_program(session, names("judge", 3), answer)
    assert asked == ["q0", "q0", "q1", "q1", "q1"]  # item 0's two missing labels, item 1's three
    assert session.decisions.labels == {0: [("judge#1", 1), ("judge#2", 0), ("judge#3", 0)]}
    assert session.decisions.skipped == {1: {"judge#1", "judge#2", "judge#3"}}
    session.close()
    again = LabelSession.resume(tmp_path / "comparisons.json", FLAGS)  # all of it in the journal
    assert again.decisions.labels == session.decisions.labels and again.decisions.skipped == session.decisions.skipped
    again.close()
