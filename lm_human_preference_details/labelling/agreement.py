"""How often labellers agree on the best of four (the paper measured labellers against each other and the authors):
label files read into items (matched by their tokens), pairwise agreement, Fleiss' kappa, agreement with a reference.

An item is its query and four samples (tokens); its labels are (labeller, best) pairs, one per labeller: a person
counts once per item, within a file and across files. A file of ours names each label's labeller ("labels", else
"labeller"); a plain OpenAI label file's records are the labels of a labeller named after the file (its stem), and two
such files of one stem are refused (their two people would count as one).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lm_human_preference_details.labelling.journal import N_SAMPLES, is_int, labeller_name, labeller_problem
from lm_human_preference_details.utils.errors import UserError

CHANCE = 1 / N_SAMPLES  # two labellers choosing at random agree this often on a best of four
Labels = dict[str, list[tuple[str, int]]]  # item (its tokens, as JSON) -> [(labeller, best)], in the order read


def item_key(record: dict) -> str:
    """What an item is, across files: its query's and four samples' tokens."""
    return json.dumps([record["query"], *(record[f"sample{j}"] for j in range(N_SAMPLES))])


def record_labels(record: dict, default: str) -> list[tuple[str, int]]:
    """A record's labels: its "labels" list, else its one label (``best``) by its "labeller", else by ``default``."""
    if "labels" in record:
        return [(labeller_name(label["labeller"]), label["best"]) for label in record["labels"]]
    return [(labeller_name(record.get("labeller", default)) or default, record["best"])]


def record_problem(record) -> Optional[str]:
    """Why ``record`` is not a best-of-4 label record (ours or OpenAI's), or None."""
    if not isinstance(record, dict):
        return "not a JSON object"
    for field in ("query", *(f"sample{j}" for j in range(N_SAMPLES))):
        if not (isinstance(record.get(field), list) and all(is_int(t) for t in record[field])):
            return f"no token list {field!r}"
    labels = record.get("labels", [{"labeller": record.get("labeller", "x"), "best": record.get("best")}])
    if not isinstance(labels, list) or not labels:
        return "'labels' is not a list of labels"
    for label in labels:
        if not isinstance(label, dict) or not (is_int(label.get("best")) and 0 <= label["best"] < N_SAMPLES):
            return f"a best that is not an int in 0..{N_SAMPLES - 1}"
        if labeller_problem(label.get("labeller")) is not None:
            return "a labeller that is not a name of 1..64 printable characters"
    return None


def read_label_file(path: Path) -> list[tuple[str, list[tuple[str, int]]]]:
    """A label file's items and their labels, or a one-line UserError naming the file (and the record) that is not one."""
    if not path.is_file():
        raise UserError(f"{path} is not a file; pass label files (JSON lists of best-of-4 records)")
    try:
        records = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{path} is not JSON; pass label files (JSON lists of best-of-4 records)") from None
    if not isinstance(records, list):
        raise UserError(f"{path} is not a label file (a JSON list of best-of-4 records); pass label files")
    for i, record in enumerate(records):
        if (why := record_problem(record)) is not None:
            raise UserError(f"{path}, record {i}: not a best-of-{N_SAMPLES} label record ({why}); pass label files")
    return [(item_key(r), record_labels(r, path.stem)) for r in records]


def is_plain(path: Path) -> bool:
    """Whether the label file ``path`` names no labeller (a plain OpenAI file: its labeller is named after its stem)."""
    try:
        records = json.loads(path.read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    return isinstance(records, list) and any(isinstance(r, dict) and "labels" not in r and "labeller" not in r
                                             for r in records)


def check_stems(paths: list[Path]) -> None:
    """Plain files name their labeller after their stem: two such files of one stem (or one file given twice) would
    count two people, or one twice, as one labeller -> a one-line UserError."""
    seen: dict[str, Path] = {}
    for path in paths:
        if path.is_file() and is_plain(path):
            other = seen.setdefault(path.stem, path)
            if other is not path:
                raise UserError(f"{other} and {path} are both plain label files named {path.stem!r}: their labels "
                                f"would count as one labeller's; rename one (its labeller is its file's stem), or "
                                "pass each file once")


def collect(files: list[tuple[Path, list[tuple[str, list[tuple[str, int]]]]]]) -> Labels:
    """The items of several files (path, [(key, labels)]), each item's labels in the order read, each labeller once per
    item (within a file and across files): a second label that agrees is left out; one that disagrees is a one-line
    UserError naming the files and the item (which of the two counts is not ours to guess)."""
    items: Labels = {}
    where: dict[tuple[str, str], tuple[Path, int]] = {}  # (item, labeller) -> (file, record) of the label kept
    order: dict[str, int] = {}
    for path, entries in files:
        for i, (key, labels) in enumerate(entries):
            mine = items.setdefault(key, [])
            order.setdefault(key, len(order))
            for who, best in labels:
                kept = next((b for w, b in mine if w == who), None)
                if kept is None:
                    mine.append((who, best))
                    where[(key, who)] = (path, i)
                elif kept != best:
                    first, j = where[(key, who)]
                    raise UserError(f"labeller {who!r} gave item {order[key]} two labels that disagree (sample {kept} "
                                    f"in {first}, record {j}; sample {best} in {path}, record {i}): a person counts "
                                    "once per item; keep one of the two labels and run again")
    return items


def category_counts(items: Labels) -> list[list[int]]:
    """n_ij: for each item with at least two labels, how many labels chose sample j."""
    return [[sum(best == j for _, best in labels) for j in range(N_SAMPLES)] for labels in items.values()
            if len(labels) >= 2]


@dataclass(frozen=True)
class Kappa:
    """Fleiss' kappa and its parts: P_i per item, their mean P_bar, the share p_j of each sample, chance P_e."""

    p_items: list[float]
    p_bar: float
    p_j: list[float]
    p_e: float
    kappa: Optional[float]  # None when P_e == 1: every label chose one sample, and kappa is 0/0 or undefined


def fleiss_kappa(counts: list[list[int]]) -> Kappa:
    """Fleiss' kappa of ``counts`` (n_ij, items with n_i >= 2 labels, any number each):
    P_i = sum_j n_ij (n_ij - 1) / (n_i (n_i - 1)), P_bar their mean, p_j = sum_i n_ij / sum_i n_i,
    P_e = sum_j p_j^2, kappa = (P_bar - P_e) / (1 - P_e); None when P_e == 1 (every label chose one sample)."""
    n = [sum(row) for row in counts]
    p_items = [sum(c * (c - 1) for c in row) / (n_i * (n_i - 1)) for row, n_i in zip(counts, n)]
    p_bar = sum(p_items) / len(p_items)
    p_j = [sum(row[j] for row in counts) / sum(n) for j in range(len(counts[0]))]
    p_e = sum(p * p for p in p_j)
    kappa = None if p_e == 1 else (p_bar - p_e) / (1 - p_e)
    return Kappa(p_items, p_bar, p_j, p_e, kappa)


def pair_agreement(items: Labels) -> dict[tuple[str, str], tuple[int, int]]:
    """For each pair of labellers (names in order): (items both labelled, items where both chose the same best)."""
    pairs: dict[tuple[str, str], tuple[int, int]] = {}
    for labels in items.values():
        for (a, best_a), (b, best_b) in itertools.combinations(sorted(labels), 2):
            both, same = pairs.get((a, b), (0, 0))
            pairs[(a, b)] = (both + 1, same + (best_a == best_b))
    return dict(sorted(pairs.items()))


def overall_agreement(items: Labels) -> tuple[int, int]:
    """(pairs of labels on one item, those that agree), over every item: each item counts n_i (n_i - 1) / 2 pairs."""
    pairs = agreeing = 0
    for labels in items.values():
        for (_, a), (_, b) in itertools.combinations(labels, 2):
            pairs, agreeing = pairs + 1, agreeing + (a == b)
    return pairs, agreeing


def reference_agreement(items: Labels, reference: str) -> dict[str, tuple[int, int]]:
    """Each other labeller's (items labelled by both it and ``reference``, items where both chose the same best)."""
    found = {}
    for (a, b), counts in pair_agreement(items).items():
        if reference in (a, b):
            found[b if a == reference else a] = counts
    return dict(sorted(found.items()))
