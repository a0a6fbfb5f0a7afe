"""Run the offline task for several seeds, offline or online or both, and write a markdown table of what it measured.

    python benchmarks/offline.py --seeds 1 2 3 --out benchmarks/results/offline.md
    python benchmarks/offline.py --modes offline online --seeds 1 2 3 4 5 --out online.md

Each seed of a mode is one `python train_policy.py --task TASK --seed S` in a subprocess, timed end to end: mode
`offline` runs `--task offline` (the reward model trained once on the label file, then PPO), mode `online` runs
`--task offline-online` (the paper's online collection with the gold labeller, docs/online.md). The numbers come
from the summary.json each run writes; beside it (benchmark.json) go the wall time and the held-out accuracy of the
run's FINAL reward model on best-of-4 requests sampled from its FINAL policy, against the gold scorer's picks
(`final_policy_accuracy`): the distribution shift the paper's online collection exists to fix. With --reuse, a seed
whose run directory holds both is not run again: seeds and modes run apart (invocations side by side) then make one
table. Below each mode's table: mean and min..max per column, whether every seed met the task's three targets
(TARGETS), and for mode offline whether each seed's summary falls inside the ranges the README's results line
states (README_RANGES).
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

import torch

ROOT = Path(__file__).resolve().parents[1]
MODES = {"offline": "offline", "online": "offline-online"}  # mode -> the --task its runs take
FINAL_ACCURACY = "final_policy/rm_accuracy"  # `final_policy_accuracy`, kept in benchmark.json
COLUMNS = [
    (FINAL_ACCURACY, "final RM acc. on final-policy samples (gold)"),
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


def run_dir_of(out_dir: Path, mode: str, seed: int) -> Path:
    """A seed's run directory: seedS for mode offline (as before there were modes), MODE_seedS for the others."""
    return out_dir / (f"seed{seed}" if mode == "offline" else f"{mode}_seed{seed}")


def run_seed(seed: int, mode: str, out_dir: Path, extra: list[str], reuse: bool = False, queries: int = 256) -> dict:
    """One end-to-end run of ``mode`` (or, with ``reuse``, the finished one in its run directory); returns its summary
    plus the wall time and the final reward model's accuracy on the final policy's samples (on ``queries``)."""
    run_dir = run_dir_of(out_dir, mode, seed)
    bench = run_dir / "benchmark.json"
    if not (reuse and (run_dir / "summary.json").exists() and bench.exists()):
        start = time.perf_counter()
        # --overwrite: the benchmark owns its run directories, a re-run replaces the last one's
        result = subprocess.run([sys.executable, str(ROOT / "train_policy.py"), "--task", MODES[mode], "--seed", str(seed),
                                 "--output-dir", str(run_dir), "--overwrite", *extra], capture_output=True, text=True)
        if result.returncode != 0:
            sys.exit(f"error: {mode} seed {seed} failed: {result.stderr.strip().splitlines()[-1]}")
        bench.write_text(json.dumps({"seconds": time.perf_counter() - start}))
    measured = json.loads(bench.read_text())
    if FINAL_ACCURACY not in measured:  # a run benchmarked before this column existed: measured once, then kept
        measured[FINAL_ACCURACY] = final_policy_accuracy(run_dir, queries)
        bench.write_text(json.dumps(measured))
    return {**json.loads((run_dir / "summary.json").read_text()), **measured}


def final_reward_model(run_dir: Path) -> Path:
    """The reward model a run ended with: online its last training's (RUN/online/reward_KK), else the one it trained
    before PPO (RUN/reward)."""
    trainings = sorted((run_dir / "online").glob("reward_*/reward_model"))
    return trainings[-1] if trainings else run_dir / "reward" / "reward_model"


def final_policy_accuracy(run_dir: Path, n: int = 256, seed: int = 12345) -> float:
    """`best_of_four_accuracy` of the run's final reward model on its final policy (the task as the run had it)."""
    from lm_human_preference_details.language.model import load_model_dir
    from lm_human_preference_details.tasks import TaskHParams

    task = TaskHParams(**json.loads((run_dir / "config.json").read_text())["task"])
    reward_model, tokenizer, _ = load_model_dir(final_reward_model(run_dir), "reward")
    policy, _, _ = load_model_dir(run_dir / "policy", "policy", temperature=task.temperature)
    return best_of_four_accuracy(policy, reward_model.score, tokenizer, task, n, seed)


@torch.no_grad()
def best_of_four_accuracy(policy, score, tokenizer, task, n: int, seed: int) -> float:
    """How often ``score`` ([4n, q] queries, [4n, r] responses -> [4n]) picks the gold scorer's best of four samples of
    ``policy``, on ``n`` held-out queries (offline_report.heldout_queries, the summary's ``seed``): requests drawn as the
    online collection draws them (truncated), labelled by the gold labeller; ties go to the first, as gold's."""
    from lm_human_preference_details.offline import corpus as offline_corpus
    from lm_human_preference_details.offline import report as offline_report
    from lm_human_preference_details.online.label_file import BEST_OF
    from lm_human_preference_details.online.labellers import GoldLabeller
    from lm_human_preference_details.ppo import truncate_responses

    queries = offline_report.heldout_queries(tokenizer, task, n, seed).repeat_interleave(BEST_OF, dim=0)  # [4n, q]
    responses = policy.sample(queries, task.response_length, generator=torch.Generator().manual_seed(seed))["responses"]
    samples = truncate_responses(responses, task.truncate_token, task.truncate_after, tokenizer.pad_token_id)  # [4n, r]
    gold = GoldLabeller(tokenizer, offline_corpus.gold_scores).label(queries[::BEST_OF], samples.view(n, BEST_OF, -1))
    gold = torch.tensor(gold)
    picks = score(queries, samples).view(n, BEST_OF).argmax(1)  # [n]
    return (picks == gold).double().mean().item()


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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=["offline"],
                        help="offline: --task offline; online: --task offline-online (docs/online.md)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/offline.md"))
    parser.add_argument("--runs-dir", type=Path, default=Path("runs/bench_offline"))
    parser.add_argument("--reuse", action="store_true", help="take a seed's finished run from --runs-dir, if there")
    parser.add_argument("--final-queries", type=int, default=256,
                        help="held-out queries (4 samples each) of the final reward model's accuracy on the final policy")
    parser.add_argument("extra", nargs="*", help="further train_policy.py flags, after --")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from lm_human_preference_details.offline.assets import VERSION, offline_dir
    from lm_human_preference_details.utils.errors import UserError
    from lm_human_preference_details.utils.outputs import check_output_file, first_line_starts, new_or_ours

    is_our_table = first_line_starts(b"Offline task ")  # a table this script wrote: a new run replaces it

    try:  # a new file, or a table this script wrote: checked before anything runs (utils/outputs.py)
        check_output_file(args.out, flag="--out", ours=is_our_table, what="markdown file", writer="run of offline.py")
    except UserError as e:
        parser.exit(2, f"error: {e}\n")

    fresh = not (offline_dir() / "labels.json").exists()  # then the first seed's wall time includes building the assets
    rows = {m: {s: run_seed(s, m, args.runs_dir, args.extra, args.reuse, args.final_queries) for s in args.seeds}
            for m in args.modes}
    extra = ["--", *args.extra] if args.extra else []
    modes = ["--modes", *args.modes] if args.modes != ["offline"] else []
    queries = ["--final-queries", str(args.final_queries)] if args.final_queries != 256 else []
    command = " ".join(["python benchmarks/offline.py", *modes, "--seeds", *map(str, args.seeds),
                        *(["--reuse"] if args.reuse else []), *queries, *extra])
    text = f"Offline task {VERSION}, {len(args.seeds)} seeds (`{command}`)"
    text += f"; seed {args.seeds[0]} built the assets (fresh cache).\n\n" if fresh else "; assets cached before.\n\n"
    text += f"Versions: {versions()}; python {sys.version.split()[0]}.\n\n"
    for mode, mode_rows in rows.items():
        if len(rows) > 1:
            text += f"## {mode}: `--task {MODES[mode]}`\n\n"
        text += table(mode_rows) + "\n" + targets(mode_rows)
        if mode == "offline":
            text += "\n" + readme_check(mode_rows, readme_ranges((ROOT / "README.md").read_text()))
        text += "\n" if len(rows) > 1 else ""
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with new_or_ours(args.out, is_our_table) as tmp:  # never over a file this script did not write
        tmp.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
