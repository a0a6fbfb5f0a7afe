"""benchmarks/online_labels.py on a small scale: its table counts what it gave, and the file it leaves is a label file."""

from __future__ import annotations

import json

from benchmarks import online_labels
from lm_human_preference_details.label_format import OAI_PAD, load_best_of_n_labels


def test_the_table_counts_the_answers_and_labels_and_the_file_is_a_label_file(tmp_path, capsys):
    online_labels.main(["--out", str(tmp_path), "--labels", "60", "--window", "20", "--rewrite", "40",
                        "--query-length", "5", "--response-length", "3"])
    out = capsys.readouterr().out
    rows = [line.strip("|").split("|") for line in out.splitlines() if line.startswith("| ") and "---" not in line][1:]
    # 60 answers, a skip every 20th: 19 labels per 20; marks at the window, the end (and the rewrite's half)
    assert [(r[0].strip(), int(r[1]), int(r[2])) for r in rows] == [
        ("append", 20, 19), ("append", 60, 57), ("rewrite (before)", 20, 19), ("rewrite (before)", 40, 38)]
    assert all(float(r[3]) > 0 for r in rows)
    assert "per label at 60 answers / at 20:" in out
    for layout, count in (("append", 57), ("rewrite", 38)):
        labels = load_best_of_n_labels(tmp_path / layout / "labels.json", n=4, query_length=5, response_length=3,
                                       pad_id=OAI_PAD)
        assert labels["samples"].shape == (count, 4, 3)
        assert sum(1 for _ in open(tmp_path / layout / "answers.jsonl")) == {"append": 60, "rewrite": 40}[layout]
    # the same answers in either layout: the labels as the answers' record holds them
    answers = [json.loads(line)["best"] for line in open(tmp_path / "append" / "answers.jsonl")]
    assert [r["best"] for r in json.loads((tmp_path / "append" / "labels.json").read_text())] == \
        [b for b in answers if b is not None]
