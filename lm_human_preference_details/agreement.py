"""Labellers' agreement on the best of four (docs/labelling.md, "Agreement"): per pair of labellers, overall, Fleiss'
kappa, and each labeller against a reference (gold, the offline task's scorer, or --reference NAME).

    python -m lm_human_preference_details.agreement labels.json
    python -m lm_human_preference_details.agreement ann.json bob.json --gold-task offline --json

Items are matched across files by their tokens (query and four samples). A label file of ours names each label's
labeller; a plain OpenAI label file is one labeller's, named after the file (its stem: two plain files of one stem are
refused). Each labeller counts once per item: a second label of an item that disagrees with the first is refused in
one line naming both. Chance agreement on a best of four is 25%.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import tyro

from lm_human_preference_details.cli.parsing import tyro_cli
from lm_human_preference_details.labelling.agreement import (
    CHANCE,
    Labels,
    category_counts,
    check_stems,
    collect,
    fleiss_kappa,
    overall_agreement,
    pair_agreement,
    read_label_file,
    reference_agreement,
)
from lm_human_preference_details.utils.errors import UserError, run_main

GOLD = "gold"  # the reference by default, and the name --gold-task's labels carry


@dataclass
class Args:
    files: tyro.conf.Positional[list[str]] = field(default_factory=list)
    """label files: ours (each label with its labeller) or OpenAI's (one labeller per file, named after the file)"""
    reference: Optional[str] = None
    """the labeller every other is compared with (default: gold, where a labeller of that name is present)"""
    gold_task: Optional[str] = None
    """a task with a gold scorer (offline): its best-of-4 pick of every item is added as labeller gold"""
    json: bool = False
    """print the figures as one JSON object instead of tables"""


def gold_task(task_name: str):
    """The task ``--gold-task`` names, which must have a gold scorer (offline) -> the task."""
    from lm_human_preference_details.tasks import TASK_NAMES, get_task  # seconds to import: only with --gold-task

    if task_name not in TASK_NAMES:
        raise UserError(f"unknown --gold-task {task_name!r}; pass --gold-task offline (the task with a gold scorer)")
    task = get_task(task_name)
    if not hasattr(task, "gold_scores"):
        raise UserError(f"--gold-task {task_name} has no gold scorer; pass --gold-task offline")
    return task


def add_gold(items: Labels, task_name: str) -> None:
    """The task's gold scorer's pick for every item, as labeller GOLD (online/labellers.py GoldLabeller, as the online run asks
    it); an item whose shapes are not the task's (query and response lengths) is refused in one line: the scorer's
    pick of another task's samples means nothing."""
    # torch, the tokenizer and the tasks take seconds to import: only with --gold-task
    import torch

    # the scorer, as the online run's gold labeller asks it, and the tokens it reads
    from lm_human_preference_details.label_format import OAI_PAD
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
    from lm_human_preference_details.online.labellers import GoldLabeller

    task = gold_task(task_name)
    shapes = (task.task.query_length, task.task.response_length)
    for n, key in enumerate(items):
        query, *samples = json.loads(key)
        if (len(query), *{len(s) for s in samples}) != shapes:
            raise UserError(f"item {n} has a {len(query)}-token query and {sorted({len(s) for s in samples})}-token "
                            f"samples, and --gold-task {task_name}'s are {shapes[0]} and {shapes[1]}: its gold scorer "
                            f"judges only its own task's samples; pass label files of the {task_name} task")
    tokenizer = gpt2_tokenizer()
    keys = [key for key, labels in items.items() if all(who != GOLD for who, _ in labels)]
    for key in keys:
        _, *samples = json.loads(key)
        tokens = torch.tensor([[tokenizer.pad_token_id if t == OAI_PAD else t for t in s] for s in samples])
        best = GoldLabeller(tokenizer, task.gold_scores).label(torch.zeros(1, 1), tokens[None])[0]  # [1, 4, r]
        items[key].append((GOLD, best))


def figures(items: Labels, reference: Optional[str]) -> dict:
    """Everything the command prints, as one JSON-ready dict."""
    share = lambda both, same: same / both if both else None  # noqa: E731
    labellers = sorted({who for labels in items.values() for who, _ in labels})
    counts = category_counts(items)
    if not counts:
        raise UserError(f"no item has labels from two labellers ({len(items)} items, labellers: "
                        f"{', '.join(labellers)}); pass files in which some items are labelled twice (the label tool's "
                        "--labels-per-item 2), or --gold-task offline")
    kappa = fleiss_kappa(counts)
    pairs, agreeing = overall_agreement(items)
    if reference is not None and reference not in labellers:
        raise UserError(f"--reference {reference} labelled none of these items (labellers: {', '.join(labellers)}); "
                        "pass one of them")
    reference = reference if reference is not None else GOLD if GOLD in labellers else None
    return {
        "items": len(items), "items_with_2_labels": len(counts), "labellers": labellers, "chance": CHANCE,
        "pairs": [{"labellers": [a, b], "items": both, "agree": same, "share": share(both, same)}
                  for (a, b), (both, same) in pair_agreement(items).items()],
        "overall": {"pairs": pairs, "agree": agreeing, "share": share(pairs, agreeing)},
        "kappa": {"value": kappa.kappa, "p_bar": kappa.p_bar, "p_e": kappa.p_e, "p_j": kappa.p_j},
        "reference": None if reference is None else {"name": reference, "labellers": [
            {"labeller": who, "items": both, "agree": same, "share": share(both, same)}
            for who, (both, same) in reference_agreement(items, reference).items()]},
    }


def table(rows: list[list[str]]) -> list[str]:
    """Rows aligned in columns: the first column left, the others right."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  " + "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip()
            for row in rows]


def report(f: dict) -> str:
    """The figures as the terminal shows them."""
    pct = lambda x: "-" if x is None else f"{100 * x:.1f}%"  # noqa: E731
    lines = [f"{f['items']} items, {f['items_with_2_labels']} with 2 or more labels; labellers: "
             f"{', '.join(f['labellers'])}",
             f"agreement on the best of 4 (chance: {pct(f['chance'])})"]
    lines += table([["labellers", "items", "agree", "share"]] + [
        [" & ".join(p["labellers"]), str(p["items"]), str(p["agree"]), pct(p["share"])] for p in f["pairs"]])
    o, k = f["overall"], f["kappa"]
    lines.append(f"overall: {o['agree']} of {o['pairs']} pairs of labels agree, {pct(o['share'])} (chance "
                 f"{pct(f['chance'])})")
    value = "undefined (every label chose one sample: P_e = 1)" if k["value"] is None else f"{k['value']:.3f}"
    lines.append(f"Fleiss' kappa (4 choices, {f['items_with_2_labels']} items): {value} (P_bar {k['p_bar']:.3f}, "
                 f"P_e {k['p_e']:.3f}; 0 is chance, 1 full agreement)")
    if f["reference"] is not None:
        lines.append(f"agreement with {f['reference']['name']}:")
        lines += table([["labeller", "items", "agree", "share"]] + [
            [r["labeller"], str(r["items"]), str(r["agree"]), pct(r["share"])] for r in f["reference"]["labellers"]])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    args = tyro_cli(Args(), list(sys.argv[1:] if argv is None else argv), __doc__.split("\n")[0])
    if not args.files:
        raise UserError("no label file given; pass one or more: python -m lm_human_preference_details.agreement "
                        "labels.json")
    if args.gold_task is not None:
        gold_task(args.gold_task)  # a bad flag before any file is read
    paths = [Path(name) for name in args.files]
    check_stems(paths)
    items = collect([(path, read_label_file(path)) for path in paths])
    if args.gold_task is not None:
        add_gold(items, args.gold_task)
    result = figures(items, args.reference)
    print(json.dumps(result, indent=1) if args.json else report(result), flush=True)
    return result


if __name__ == "__main__":
    run_main(main)
