"""What a label costs the online run as its files grow to the paper's scale (60,000 labels: Ziegler et al. 2019's
summarisation): each label goes the way a page's label goes in train_policy.py --online.labeller page, one at a time,
first to the answers' record (RUN/online/answers.jsonl: a line appended, fsynced), then to the label file
(RUN/online/labels.json: appended, fsynced).

    python benchmarks/online_labels.py --out /tmp/online-labels          # 60,000 labels of tldr's shapes
    python benchmarks/online_labels.py --out /tmp/online-labels --rewrite 5000   # and the old whole-file rewrite

Prints a markdown table: the mean time per label over each window of --window labels ending at 1,000, 10,000, ...
and the last, and the files' sizes; with --rewrite N, the same for the layout before appends (the whole list
rewritten atomically after each label) up to N labels, for comparison. The tokens are random ids in tldr's shapes
(a 512-token query, four 48-token samples); the label file it leaves is read by train_reward.py as any other.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

from lm_human_preference_details.online.answers import AnswerRecord, Request
from lm_human_preference_details.online.label_file import OnlineLabelFile
from lm_human_preference_details.utils.files import atomic_path

PAD = 50257


def requests(n: int, query_length: int, response_length: int, seed: int = 0):
    """``n`` requests of random tokens in the given shapes, with their answers (a skip every 20th, as people skip)."""
    rng = random.Random(seed)
    for i in range(n):
        query = [rng.randrange(50257) for _ in range(query_length)]
        samples = [[rng.randrange(50257) for _ in range(response_length)] for _ in range(4)]
        yield Request(i // 64, i % 64, i // 512, query, samples), None if i % 20 == 19 else rng.randrange(4)


class Rewrite(OnlineLabelFile):
    """The layout before appends, for comparison: the whole list rewritten atomically after each batch."""

    def add(self, answered, pad_id: int) -> None:
        self.records.extend({"query": r.query, **{f"sample{i}": s for i, s in enumerate(r.samples)}, "best": b,
                             "update": r.update, "labeller": who} for r, b, who in answered if b is not None)
        with atomic_path(self.path) as tmp:
            tmp.write_text(json.dumps(self.records))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())


def measure(directory: Path, n: int, window: int, marks: list[int], args, layout=OnlineLabelFile) -> list[dict]:
    """Label ``n`` requests one at a time -> a row per mark: the mean seconds per label over the ``window`` labels
    before it, and the files' sizes then."""
    directory.mkdir(parents=True, exist_ok=False)
    answers, labels = AnswerRecord(directory / "answers.jsonl"), layout(directory / "labels.json")
    rows, times = [], []
    for i, (request, best) in enumerate(requests(n, args.query_length, args.response_length), 1):
        start = time.perf_counter()
        answers.record(request, best, "ann")
        labels.add([(request, best, "ann")], PAD)
        times.append(time.perf_counter() - start)
        if i in marks:
            last = times[-window:]
            rows.append({"answers": i, "labels": len(labels), "per_label_ms": 1000 * sum(last) / len(last),
                         "labels_mb": (directory / "labels.json").stat().st_size / 2**20,
                         "answers_mb": (directory / "answers.jsonl").stat().st_size / 2**20})
            print(f"{layout.__name__}: {i} answers, {rows[-1]['per_label_ms']:.2f} ms per label", flush=True)
    answers.close()
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="a new directory for the files")
    parser.add_argument("--labels", type=int, default=60_000, help="answers to give (a skip every 20th)")
    parser.add_argument("--window", type=int, default=1000, help="labels per measured window")
    parser.add_argument("--rewrite", type=int, default=0, help="also time the whole-file rewrite up to this many")
    parser.add_argument("--query-length", type=int, default=512)
    parser.add_argument("--response-length", type=int, default=48)
    args = parser.parse_args(argv)
    marks = sorted({m for m in (args.window, 10_000, 20_000, 30_000, 40_000, 50_000, args.labels) if m <= args.labels})
    rows = measure(args.out / "append", args.labels, args.window, marks, args)
    table = [f"| layout | answers | labels | ms per label (last {args.window}) | labels.json MiB | answers.jsonl MiB |",
             "|---|---|---|---|---|---|"]
    table += [f"| append | {r['answers']} | {r['labels']} | {r['per_label_ms']:.2f} | {r['labels_mb']:.1f} | "
              f"{r['answers_mb']:.1f} |" for r in rows]
    if args.rewrite:
        old = measure(args.out / "rewrite", args.rewrite, args.window,
                      sorted({m for m in (args.window, args.rewrite // 2, args.rewrite) if m <= args.rewrite}), args,
                      Rewrite)
        table += [f"| rewrite (before) | {r['answers']} | {r['labels']} | {r['per_label_ms']:.2f} | "
                  f"{r['labels_mb']:.1f} | {r['answers_mb']:.1f} |" for r in old]
    print("\n".join(table))
    first, last = rows[0]["per_label_ms"], rows[-1]["per_label_ms"]
    print(f"\nper label at {rows[-1]['answers']} answers / at {rows[0]['answers']}: {last / first:.2f}x")


if __name__ == "__main__":
    main()
