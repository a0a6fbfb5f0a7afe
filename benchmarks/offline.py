"""Run the offline task for several seeds and write a markdown table of what it measured.

    python benchmarks/offline.py --seeds 1 2 3 --out benchmarks/results/offline.md

Each seed is one `python train_policy.py --task offline --seed S` (reward model, then PPO) in a
subprocess, timed end to end; the numbers come from the summary.json each run writes, the wall time goes
beside it (benchmark.json). With --reuse, a seed whose run directory holds both is not run again: seeds
run apart (two invocations side by side) then make one table. Below the
table: mean and min..max per column, whether every seed met the task's three targets (TARGETS), and whether
each seed's summary falls inside the ranges the README's results line states (README_RANGES).
A benchmark, not a test: nothing here asserts, and the exit status is 0 either way.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = [
    ("reward_model/heldout_accuracy", "RM held-out acc. (gold)"),
    ("initial/gold_mean", "gold before"),
    ("initial/gold_std", "gold std before"),
    ("trained/gold_mean", "gold after"),
    ("gold_gain_in_initial_stds", "gain (initial stds)"),
    ("initial/score_mean", "RM score before"),
    ("trained/score_mean", "RM score after"),
    ("trained/kl", "final KL"),
    ("seconds", "wall time (s)"),
]
# What the README promises of every seed: (summary key, description, test of the value given the run's summary)
TARGETS = [
    ("reward_model/heldout_accuracy", "RM held-out accuracy >= 0.65", lambda v, s: v >= 0.65),
    ("gold_gain_in_initial_stds", "gold gain >= 1.0 initial stds", lambda v, s: v >= 1.0),
    ("trained/kl", "final KL within 0.5x-2x its target", lambda v, s: 0.5 * s["kl_target"] <= v <= 2 * s["kl_target"]),
]
VERSIONED = ["torch", "transformers", "tokenizers", "numpy"]
# The README's offline results line, as (summary key, pattern of its low and high end, decimals it is stated to)
README_RANGES = [
    ("reward_model/heldout_accuracy", r"held-out accuracy (\d\.\d+)-(\d\.\d+)", 2),
    ("gold_gain_in_initial_stds", r"raised by \+(\d\.\d+) to \+(\d\.\d+) initial standard deviations", 2),
    ("trained/kl", r"final KL (\d+\.\d+)-(\d+\.\d+)", 1),
]


def readme_ranges(readme: str) -> dict[str, tuple[float, float, int]]:
    """The README's stated offline ranges: summary key -> (low, high, decimals); a missing one is a ValueError."""
    item = re.search(r"^- `--task offline`.*?(?=^- |^$)", readme, re.M | re.S)  # the bullet, its wrapped lines too
    text = " ".join(item[0].split()) if item else ""
    ranges = {}
    for key, pattern, decimals in README_RANGES:
        found = re.search(pattern, text)
        if not found:
            raise ValueError(f"README.md's `--task offline` results line does not state {pattern!r}")
        ranges[key] = (float(found[1]), float(found[2]), decimals)
    return ranges


def outside_readme(summary: dict, ranges: dict[str, tuple[float, float, int]]) -> list[str]:
    """The summary's values that fall outside the README's ranges, rounded as the README states them."""
    return [f"{key} {round(summary[key], d)} not in {low}-{high}" for key, (low, high, d) in ranges.items()
            if not low <= round(summary[key], d) <= high]


def readme_check(rows: dict[int, dict], ranges: dict[str, tuple[float, float, int]]) -> str:
    """Markdown: per seed, whether its summary lies inside the README's stated ranges."""
    misses = {s: outside_readme(r, ranges) for s, r in rows.items()}
    lines = [f"- seed {s}: " + ("outside: " + "; ".join(m) if m else "inside") for s, m in misses.items()]
    verdict = "every seed inside the README's ranges: " + ("no" if any(misses.values()) else "yes")
    return "Against the README's stated ranges:\n" + "\n".join(lines) + f"\n\n{verdict}\n"


def run_seed(seed: int, out_dir: Path, extra: list[str], reuse: bool = False) -> dict:
    """One end-to-end run (or, with ``reuse``, the finished one in its run directory); returns its summary plus the
    wall time."""
    run_dir = out_dir / f"seed{seed}"
    if reuse and (run_dir / "summary.json").exists() and (run_dir / "benchmark.json").exists():
        return {**json.loads((run_dir / "summary.json").read_text()), **json.loads((run_dir / "benchmark.json").read_text())}
    start = time.perf_counter()
    # --overwrite: the benchmark owns its run directories, a re-run replaces the last one's
    result = subprocess.run([sys.executable, str(ROOT / "train_policy.py"), "--task", "offline", "--seed", str(seed),
                             "--output-dir", str(run_dir), "--overwrite", *extra], capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"error: seed {seed} failed: {result.stderr.strip().splitlines()[-1]}")
    seconds = {"seconds": time.perf_counter() - start}
    (run_dir / "benchmark.json").write_text(json.dumps(seconds))
    return {**json.loads((run_dir / "summary.json").read_text()), **seconds}


def table(rows: dict[int, dict]) -> str:
    """Markdown: one row per seed, then the mean and the min..max of each column."""
    head = "| seed | " + " | ".join(title for _, title in COLUMNS) + " |\n|" + "---|" * (len(COLUMNS) + 1) + "\n"
    body = "".join(f"| {s} | " + " | ".join(f"{r[k]:.3f}" for k, _ in COLUMNS) + " |\n" for s, r in rows.items())
    columns = [[r[key] for r in rows.values()] for key, _ in COLUMNS]
    mean = "| mean | " + " | ".join(f"{statistics.mean(v):.3f}" for v in columns) + " |\n"
    spread = "| min..max | " + " | ".join(f"{min(v):.3f}..{max(v):.3f}" for v in columns) + " |\n"
    return head + body + mean + spread


def targets(rows: dict[int, dict]) -> str:
    """Markdown lines: for each target, the seeds that met it; then whether every seed met all three."""
    lines, every = [], True
    for key, text, ok in TARGETS:
        met = [s for s, r in rows.items() if ok(r[key], r)]
        every &= len(met) == len(rows)
        missed = [str(s) for s in rows if s not in met]
        lines.append(f"- {text}: {len(met)}/{len(rows)} seeds" + (f" (missed: seed {', '.join(missed)})" if missed else ""))
    verdict = "every seed met all three targets: " + ("yes" if every else "no")
    return "\n".join(lines) + f"\n\n{verdict}\n"


def versions() -> str:
    """The versions that move the outcome, as installed here: `torch 2.13.0+cpu, transformers 5.23.0, ...`."""
    from importlib.metadata import version

    return ", ".join(f"{name} {version(name)}" for name in VERSIONED)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/offline.md"))
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/bench_offline"))
    parser.add_argument("--reuse", action="store_true", help="take a seed's finished run from --runs-dir, if there")
    parser.add_argument("extra", nargs="*", help="further train_policy.py flags, after --")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from lm_human_preference_details.offline import VERSION, offline_dir

    fresh = not (offline_dir() / "labels.json").exists()  # then the first seed's wall time includes building the assets
    rows = {s: run_seed(s, args.runs_dir, args.extra, args.reuse) for s in args.seeds}
    extra = ["--", *args.extra] if args.extra else []
    command = " ".join(["python benchmarks/offline.py --seeds", *map(str, args.seeds), *(["--reuse"] if args.reuse else []),
                        *extra])
    text = f"Offline task {VERSION}, {len(rows)} seeds (`{command}`)"
    text += f"; seed {args.seeds[0]} built the assets (fresh cache).\n\n" if fresh else "; assets cached before.\n\n"
    text += f"Versions: {versions()}; python {sys.version.split()[0]}.\n\n"
    text += table(rows) + "\n" + targets(rows) + "\n" + readme_check(rows, readme_ranges((ROOT / "README.md").read_text()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(args.out)
    print(text)


if __name__ == "__main__":
    main()
