"""offline/report.py: the end-of-run report's numbers."""

from __future__ import annotations

import math

import pytest

from lm_human_preference_details.offline import report as offline_report


def test_the_gold_gain_is_in_initial_stds_and_undefined_without_spread():
    assert offline_report.gain_in_stds(0.5, -0.25, 0.25) == pytest.approx(3.0)
    # every initial sample scored the same (a small report of a tiny model): NaN, not a ZeroDivisionError at a run's end
    assert math.isnan(offline_report.gain_in_stds(0.5, 0.5, 0.0))


# ----------------------------------------------------------------------------- the offline report's held-out queries
def test_offline_report_evaluates_a_run_on_label_queries(tokenizer, tmp_path, monkeypatch):
    from lm_human_preference_details.offline import corpus as offline_corpus
    from lm_human_preference_details.offline import report as offline_report
    from lm_human_preference_details.tasks import TaskHParams

    passages = offline_corpus.corpus(40, seed=2)
    (tmp_path / "queries_test.txt").write_text("\n\n".join(passages) + "\n")
    monkeypatch.setattr(offline_report, "offline_dir", lambda: tmp_path)  # where the held-out passages are kept
    labels_run = TaskHParams(query_dataset="oai-label-queries", query_length=32).resolved()
    text_run = TaskHParams(query_dataset=str(tmp_path / "queries.txt"), query_length=32).resolved()  # start, end: '.'
    queries = offline_report.heldout_queries(tokenizer, labels_run, 8, seed=5)
    # the label file's queries were cut from the corpus with '.' as start and end text (make_labels): so are these
    assert queries.shape == (8, 32) and queries.equal(offline_report.heldout_queries(tokenizer, text_run, 8, seed=5))
    texts = [tokenizer.decode([t for t in q if t != tokenizer.pad_token_id]) for q in queries.tolist()]
    assert all(any(t.strip()[:20] in p for p in passages) for t in texts)
