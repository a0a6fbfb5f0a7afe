"""The summarisation tasks' ROUGE table (paper, table 4): ROUGE-1, ROUGE-2 and ROUGE-L F1 of each policy's summaries
against the reference summaries, with lead-3 (an article's first three sentences) and the reference itself as rows,
computed by Google's `rouge-score` package (stemming on, as the CNN/DM literature reports it) rather than by hand."""

from __future__ import annotations

import re

METRICS = ("rouge1", "rouge2", "rougeL")
# the space after . ! or ?, or after one of them and a closing quote or bracket
SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


def rouge_f1(predictions: list[str], references: list[str]) -> dict[str, float]:
    """The mean F1 of each of METRICS over pairs (prediction, reference)."""
    from rouge_score import rouge_scorer  # imports nltk: only when a ROUGE table is asked for

    if len(predictions) != len(references) or not predictions:
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    scorer = rouge_scorer.RougeScorer(list(METRICS), use_stemmer=True)
    totals = dict.fromkeys(METRICS, 0.0)
    for prediction, reference in zip(predictions, references):
        scores = scorer.score(reference, prediction)  # (target, prediction)
        for m in METRICS:
            totals[m] += scores[m].fmeasure
    return {m: total / len(predictions) for m, total in totals.items()}


def lead_3(article: str) -> str:
    """An article's first three sentences (the summarisation baseline of the paper's table 4)."""
    sentences = [s for s in SENTENCE_END.split(article.strip()) if s]
    return " ".join(sentences[:3])


def rouge_table(responses: dict[str, list[str]], articles: list[str], references: list[str]) -> dict[str, dict]:
    """ROUGE F1 of each policy's responses, of lead-3 and of the references themselves (1.0: the table's ceiling), all
    against ``references`` -> {row: {metric: F1}}."""
    rows = {name: rouge_f1(texts, references) for name, texts in responses.items()}
    rows["lead-3"] = rouge_f1([lead_3(a) for a in articles], references)
    rows["reference"] = rouge_f1(references, references)
    return rows


def format_table(rows: dict[str, dict]) -> str:
    """The table as the terminal shows it, in percent as the paper prints it."""
    width = max(len(name) for name in rows)
    lines = [f"{'ROUGE F1 (%)':<{width}}  {'R-1':>6}  {'R-2':>6}  {'R-L':>6}"]
    lines += [f"{name:<{width}}  " + "  ".join(f"{100 * scores[m]:6.2f}" for m in METRICS) for name, scores in rows.items()]
    return "\n".join(lines)
