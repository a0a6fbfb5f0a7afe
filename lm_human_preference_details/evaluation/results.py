"""What an evaluation found, from its items and their labels alone: for each pair of policies the share of items on
which the majority prefers each (win rate) with a 95% interval over items, the share of single labels, the
labellers' agreement and the position bias; printed as a table, drawn, and written as a Hugging Face dataset.

An item is one query and two responses, shown left (0) and right (1); a label is (labeller, side chosen). A skip is
no label, as in the label tool, and an item no one labelled counts nowhere. The majority of an item's labels decides
it; a tie (an even K, or skips) is half a win for each policy.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Optional

from lm_human_preference_details.labelling.agreement import fleiss_kappa, overall_agreement, pair_agreement
from lm_human_preference_details.utils.files import atomic_path
from lm_human_preference_details.utils.outputs import atomic_dir

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
LEFT, RIGHT = 0, 1


def majority(sides: list[int]) -> Optional[int]:
    """The side (LEFT or RIGHT) most labels chose; None for a tie or no label."""
    left, right = sides.count(LEFT), sides.count(RIGHT)
    return None if left == right else LEFT if left > right else RIGHT


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of a share ``successes`` / ``n`` (95% for the default z); (0, 1) when n is 0."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def share(successes: float, n: int) -> dict:
    """A share with its 95% interval, as results.json holds it."""
    low, high = wilson_interval(successes, n)
    return {"value": successes / n if n else None, "low": low, "high": high}


def pair_figures(a: str, b: str, items: list[dict]) -> dict:
    """The figures of policies ``a`` and ``b`` over their ``items`` ({"policies": [left, right], "labels":
    [(labeller, side)]}): majority wins and ties, win rate of each with its interval over items, single-label shares,
    position bias (how often the left one wins a single label) and agreement (labelling.agreement's figures)."""
    unlabelled = sum(not item["labels"] for item in items)  # skipped by every labeller, or not reached yet
    items = [item for item in items if item["labels"]]
    wins = {a: 0, b: 0}
    ties = labels = left = 0
    single = {a: 0, b: 0}
    for item in items:
        sides = [side for _, side in item["labels"]]
        decided = majority(sides)
        if decided is None:
            ties += 1
        else:
            wins[item["policies"][decided]] += 1
        for side in sides:
            single[item["policies"][side]] += 1
        labels += len(sides)
        left += sides.count(LEFT)
    n = len(items)
    keyed = {str(i): [(who, item["policies"][side]) for who, side in item["labels"]] for i, item in enumerate(items)}
    return {
        "policies": [a, b], "items": n, "unlabelled": unlabelled, "wins": wins, "ties": ties, "labels": labels,
        "win_rate": {p: share(wins[p] + ties / 2, n) for p in (a, b)},
        "single_label_share": {p: share(single[p], labels) for p in (a, b)},
        "position_bias": {"left_share": share(left, labels)},
        "agreement": agreement(keyed, (a, b)),
    }


def agreement(keyed: dict[str, list[tuple[str, str]]], choices: tuple[str, str]) -> dict:
    """The agreement command's figures over items with two or more labels: per pair of labellers, overall, and Fleiss'
    kappa over the two choices (None where no item has two labels, or every label chose one policy)."""
    pairs, agreeing = overall_agreement(keyed)
    counts = [[sum(p == c for _, p in labels) for c in choices] for labels in keyed.values() if len(labels) >= 2]
    kappa = fleiss_kappa(counts).kappa if counts else None
    return {"pairs": [{"labellers": [x, y], "items": both, "agree": same} for (x, y), (both, same)
                      in pair_agreement(keyed).items()],
            "overall": {"pairs": pairs, "agree": agreeing, "share": agreeing / pairs if pairs else None},
            "kappa": kappa, "items_with_2_labels": len(counts)}


def figures(policies: list[str], items: list[dict]) -> list[dict]:
    """Every pair of ``policies`` (in the order given), over the items that compare them."""
    return [pair_figures(a, b, [it for it in items if set(it["policies"]) == {a, b}])
            for a, b in itertools.combinations(policies, 2)]


def table(pairs: list[dict], k: int) -> str:
    """The figures as the terminal shows them: one row per pair, the first policy's win rate over the second's."""
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    rows = [["policy", "vs", "items", "wins-losses-ties", f"win rate (majority of {k})", "95% interval",
             "single labels", "left wins", "agreement"]]
    for f in pairs:
        a, b = f["policies"]
        w = f["win_rate"][a]
        rows.append([a, b, str(f["items"]), f"{f['wins'][a]}-{f['wins'][b]}-{f['ties']}", pct(w["value"]),
                     f"{pct(w['low'])} to {pct(w['high'])}", pct(f["single_label_share"][a]["value"]),
                     pct(f["position_bias"]["left_share"]["value"]), pct(f["agreement"]["overall"]["share"])])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()
                     for r in rows)


def write_json(path: Path, data: dict) -> None:
    """``path`` written whole (a temporary, then renamed): never half-written."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1) + "\n")


def draw(pairs: list[dict], path: Path) -> None:
    """The win rates with their 95% intervals, one bar per pair (the first policy's over the second's), 0.5 marked."""
    # matplotlib takes a second to import: only once there are results to draw
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen: no display needed

    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.5 * len(pairs)))
    for y, f in enumerate(pairs):
        a, b = f["policies"]
        w = f["win_rate"][a]
        if w["value"] is None:  # no item of this pair was labelled
            continue
        ax.errorbar([w["value"]], [y], xerr=[[w["value"] - w["low"]], [w["high"] - w["value"]]], fmt="o", capsize=4)
    ax.axvline(0.5, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(pairs)), [f"{f['policies'][0]}\nvs {f['policies'][1]}" for f in pairs], fontsize=8)
    ax.set_xlim(0, 1)
    ax.set_xlabel("win rate by majority (95% interval over items)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


DATASET_CARD = """---
configs:
- config_name: comparisons
  data_files: comparisons.parquet
  default: true
tags:
- lm-human-preferences
- evaluation
---

# Blind comparisons of {policies}

Task {task}: each row is one label of one item (a held-out query and two policies' responses, shown left and right in
an order drawn at random): `left_policy`, `right_policy`, `query`, `left`, `right`, `labeller`, `choice` (`left` or
`right`), `preferred` (the policy chosen) and `majority` (the policy the item's majority preferred; empty for a tie).
{n} rows.

```python
import datasets
rows = datasets.load_dataset("parquet", data_files="DIR/comparisons.parquet", split="train")
```
"""


def export_dataset(items: list[dict], task: str, policies: list[str], out: Path) -> None:
    """The labels as a Hugging Face dataset in ``out`` (a parquet file and its card), written whole as the export
    command writes a label file's."""
    import datasets  # seconds to import: only once there are results

    rows = []
    for i, item in enumerate(items):
        decided = majority([side for _, side in item["labels"]])
        for who, side in item["labels"]:
            rows.append({"item": i, "query_index": item["query_index"], "left_policy": item["policies"][0],
                         "right_policy": item["policies"][1], "query": item["query_text"],
                         "left": item["sample_texts"][0], "right": item["sample_texts"][1], "labeller": who,
                         "choice": ("left", "right")[side], "preferred": item["policies"][side],
                         "majority": "" if decided is None else item["policies"][decided]})
    with atomic_dir(out) as tmp:  # an entry of the evaluation's run directory (utils/outputs.py)
        if rows:
            datasets.Dataset.from_list(rows).to_parquet(str(tmp / "comparisons.parquet"))
        (tmp / "README.md").write_text(DATASET_CARD.format(policies=", ".join(policies), task=task, n=len(rows)))
