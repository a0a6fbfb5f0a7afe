"""The sentiment preset at full size on one GPU box, end to end, as a user runs it: check a box before a long run.

    python benchmarks/full_size.py --out /tmp/full-size                  # about 3.5 minutes on one H200
    python benchmarks/full_size.py --out /tmp/full-size --bf16           # the same with --bf16
    python benchmarks/full_size.py --out /tmp/full-size-cpu --small      # the same steps at toy sizes (any machine)

Needs no network: it builds stand-in assets from seeds under OUT/assets (reused when there): GPT-2 124M's shapes with
random weights (`GPT2Config()`), the real GPT-2 tokenizer, best-of-4 labels in OpenAI's schema (random tokens: 4,992 to
train on and the preset's 256 held out) and a parquet of random sentences in bookcorpus's schema (a `text` column,
1M rows by default). Then three runs of `train_policy.py --task sentiment` (batch 512, 8 emulated ranks, the reward
model trained first, then PPO; `--save-interval 5`), each in a process of its own:
  A. uninterrupted, --updates PPO updates;
  B. the same run killed with SIGKILL once --kill-after updates are logged, then `--resume` to the end; its metrics are
     compared with A's, update by update (equal up to CUDA's nondeterminism: the largest differences are printed);
  C. --exact-ranks for --exact-updates updates: the seconds per update it costs.
Printed (and written to OUT/report.md): each phase's wall time (start-up, reward model, PPO), seconds per update,
what each checkpoint costs the loop (`save_costs`: the wait for the device-to-host copy and the writer thread's share
of the machine, as the time of the updates after a save over the median update), peak GPU memory, and B's and C's
numbers against A's.
A benchmark, not a test: nothing here asserts, and the exit status is 0 when the three runs ended.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the package sits at the repository root
# runs train_policy.py as `python train_policy.py ARGS` does, then writes the process's peak GPU memory to argv[1]
RUNNER = """import atexit, json, runpy, sys, torch
out, sys.argv = sys.argv[1], ["train_policy.py"] + sys.argv[2:]
atexit.register(lambda: open(out, "w").write(json.dumps({"peak_bytes": torch.cuda.max_memory_allocated()
                                                         if torch.cuda.is_available() else 0})))
runpy.run_path("train_policy.py", run_name="__main__")
"""
MARKS = {"train_reward: ": "reward model", "train_policy: ": "PPO", "saved policy to": "end"}  # phase -> first line
WORDS = ("the a an old young river garden house she he they walked said looked quietly under over never always "
         "morning night light dark door window city road and but then because when").split()


def build_assets(out: Path, rows: int, labels: int, small: bool, seed: int = 0) -> dict[str, Path]:
    """The stand-in model, labels and query parquet under ``out`` (kept: a second call reuses them)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from lm_human_preference_details.label_format import OAI_PAD
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
    from lm_human_preference_details.offline.pretrain import tiny_gpt2
    from lm_human_preference_details.utils.files import atomic_path
    from lm_human_preference_details.utils.outputs import atomic_dir

    paths = {"model": out / "gpt2-shaped", "labels": out / "labels.json", "queries": out / "books.parquet"}
    if not paths["model"].exists():
        torch.manual_seed(seed)
        model = tiny_gpt2(seed) if small else GPT2LMHeadModel(GPT2Config())  # GPT2Config(): GPT-2 124M's shapes
        with atomic_dir(paths["model"], replace=False) as tmp:
            model.save_pretrained(tmp)
            gpt2_tokenizer().save_pretrained(tmp)
    if not paths["labels"].exists():
        rng = random.Random(seed)  # OpenAI's schema: 64 query tokens, four 24-token samples, pads 50259
        tokens = lambda n: [rng.randrange(50000) for _ in range(n)]  # noqa: E731
        records = [{"query": tokens(60) + [OAI_PAD] * 4, **{f"sample{i}": tokens(24) for i in range(4)},
                    "best": rng.randrange(4)} for _ in range(labels)]
        with atomic_path(paths["labels"]) as tmp:
            tmp.write_text(json.dumps(records))
    if not paths["queries"].exists():
        draw = np.random.default_rng(seed)
        words = np.array(WORDS)[draw.integers(0, len(WORDS), size=(rows, 12))]
        text = pa.array([" ".join(w).capitalize() + "." for w in words])
        with atomic_path(paths["queries"]) as tmp:
            pq.write_table(pa.table({"text": text}), tmp)
    return paths


def policy_argv(paths: dict, run_dir: Path, updates: int, args: argparse.Namespace) -> list[str]:
    batch = 64 if args.small else 512
    argv = ["--task", "sentiment", "--base-model", str(paths["model"]), "--task.query-dataset", str(paths["queries"]),
            "--rewards.train-new-model.labels.source", str(paths["labels"]), "--ppo.batch-size", str(batch),
            "--ppo.total-episodes", str(batch * updates), "--save-interval", str(args.save_interval),
            "--output-dir", str(run_dir), "--sample-print-interval", "1000"]
    if args.small:  # the same steps at toy sizes, on whatever device there is: fewer labels, smaller batches
        new_model = "--rewards.train-new-model."
        argv += ["--device", "auto" if torch_cuda() else "cpu", f"{new_model}labels.num-train", "64",
                 f"{new_model}eval-labels", "16", f"{new_model}normalize-samples", "16",
                 f"{new_model}rollout-batch-size", "16", f"{new_model}batch-size", "16"]
    return argv + (["--bf16"] if args.bf16 else [])


def torch_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def start(argv: list[str], run_dir: Path, log_name: str) -> tuple[subprocess.Popen, Path]:
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    peak = run_dir.parent / f"{log_name}.peak.json"
    proc = subprocess.Popen([sys.executable, "-u", "-c", RUNNER, str(peak), *argv], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))})
    return proc, peak


def follow(proc: subprocess.Popen, log: Path, stop_at_row: int = 0, metrics: Path | None = None) -> dict[str, float]:
    """Copy the run's output to ``log`` with times; the time each phase's first line came; SIGKILL the run once
    ``metrics`` has ``stop_at_row`` rows (0: never)."""
    t0, marks = time.time(), {}
    with open(log, "a") as f:
        for line in proc.stdout:
            now = time.time() - t0
            f.write(f"{now:8.2f} {line}")
            marks.update({phase: now for mark, phase in MARKS.items() if line.startswith(mark) and phase not in marks})
            if stop_at_row and metrics.exists() and len(metrics.read_text().splitlines()) >= stop_at_row:
                proc.send_signal(signal.SIGKILL)
                marks["killed"] = now
                break
    proc.wait()
    marks["exit"], marks["returncode"] = time.time() - t0, proc.returncode
    return marks


def rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def update_seconds(run_rows: list[dict]) -> dict[int, float]:
    """update -> its wall time, from the run's clock at each logged update (the first update has no predecessor)."""
    t = {int(r["step"]): float(r["ppo/elapsed/time"]) for r in run_rows if "ppo/elapsed/time" in r}
    return {s: t[s] - t[s - 1] for s in sorted(t) if s - 1 in t}


def largest_differences(a: list[dict], b: list[dict], n: int = 6) -> list[tuple[str, float]]:
    """The metrics whose values differ most between two runs over their common updates (|a - b|, largest first)."""
    by_step = {int(r["step"]): r for r in b}
    diffs: dict[str, float] = {}
    for r in a:
        other = by_step.get(int(r["step"]), {})
        for k, v in r.items():
            if k != "step" and k in other and isinstance(v, (int, float)) and "elapsed" not in k:
                diffs[k] = max(diffs.get(k, 0.0), abs(float(v) - float(other[k])))
    return sorted(diffs.items(), key=lambda kv: -kv[1])[:n]


def run(name: str, argv: list[str], out: Path, kill_at: int = 0) -> dict:
    run_dir = out / name
    proc, peak = start(argv, run_dir, name)
    print(f"[{name}] python train_policy.py {' '.join(argv)}", flush=True)
    marks = follow(proc, out / f"{name}.log", kill_at, run_dir / "metrics.jsonl")
    marks["peak_bytes"] = json.loads(peak.read_text())["peak_bytes"] if peak.exists() else None
    print(f"[{name}] {json.dumps(marks)}", flush=True)
    return marks


def save_costs(secs: dict[int, float], save_interval: int) -> tuple[float, list[float]]:
    """(median seconds per update, what each save added to the loop): a save follows update u when (u + 1) %
    save_interval == 0 (updates count from 0); the updates after it wait for the copy to CPU memory and share the
    machine with the thread that writes, so each save's cost is its interval's extra time over the median update."""
    median = statistics.median(secs.values())
    firsts = [u for u in secs if u % save_interval == 0 and u > 0]
    intervals = [[secs[v] for v in range(u, u + save_interval) if v in secs] for u in firsts]
    return median, [sum(t) - len(t) * median for t in intervals if len(t) == save_interval]


def summary(name: str, marks: dict, run_rows: list[dict], save_interval: int) -> list[str]:
    marks = {"reward model": marks.get("PPO", 0.0), **marks}  # a resumed run reuses its reward model: no such phase
    ppo_end = marks.get("end", marks["exit"])
    lines = [f"- {name}: start-up {marks['reward model']:.1f} s, reward model {marks['PPO'] - marks['reward model']:.1f} s, "
             f"PPO {ppo_end - marks['PPO']:.1f} s ({len(run_rows)} updates logged), whole process {marks['exit']:.1f} s, "
             f"exit {marks['returncode']}"]
    secs = update_seconds(run_rows)
    if secs:
        median, costs = save_costs(secs, save_interval)
        lines.append(f"  - seconds per update: median {median:.3f}, min {min(secs.values()):.3f}, max "
                     f"{max(secs.values()):.3f} (the first update, which has no predecessor, excluded)")
        if costs:
            lines.append("  - each save's cost to the loop (its interval's time over the median update): "
                         + ", ".join(f"{c:+.2f} s" for c in costs))
    if marks.get("peak_bytes"):
        lines.append(f"  - peak GPU memory (max_memory_allocated): {marks['peak_bytes'] / 2**30:.2f} GiB")
    return lines


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="folder for the assets, the three runs and report.md")
    p.add_argument("--updates", type=int, default=25, help="PPO updates of runs A and B (default 25)")
    p.add_argument("--save-interval", type=int, default=5, help="--save-interval of the runs (default 5)")
    p.add_argument("--kill-after", type=int, default=13,
                   help="run B is killed once this many updates are logged (default 13: its last checkpoint holds 10)")
    p.add_argument("--exact-updates", type=int, default=6,
                   help="PPO updates of run C, --exact-ranks (default 6; 0: no run C)")
    p.add_argument("--rows", type=int, default=1_000_000, help="rows of the query parquet (default 1M)")
    p.add_argument("--labels", type=int, default=4992 + 256, help="labels in the file (default 4,992 + 256 held out)")
    p.add_argument("--bf16", action="store_true", help="the runs with --bf16")
    p.add_argument("--small", action="store_true", help="a tiny model, batch 64 and 64 labels: the steps on any machine")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    for name in ("updates", "save_interval", "kill_after", "exact_updates", "rows", "labels"):
        if getattr(args, name) < (0 if name == "exact_updates" else 1):  # before any asset is built or run started
            sys.exit(f"error: --{name.replace('_', '-')} must be at least {0 if name == 'exact_updates' else 1}, "
                     f"got {getattr(args, name)}")
    out = Path(args.out)
    ours = [name for run in "ABC" for name in (run, f"{run}.log", f"{run}.peak.json")] + ["report.md"]
    if any((out / name).exists() or (out / name).is_symlink() for name in ours):  # never replace or append to them
        sys.exit(f"error: {out} already holds runs or a report; pass a new --out (the assets of an old one can be "
                 "copied in)")
    t = time.time()
    paths = build_assets(out / "assets", args.rows, args.labels, args.small)
    print(f"assets in {out / 'assets'} ({time.time() - t:.1f} s)", flush=True)
    runs = {"A": run("A", policy_argv(paths, out / "A", args.updates, args), out)}
    if runs["A"]["returncode"] != 0:
        sys.exit(f"error: run A failed (exit {runs['A']['returncode']}); its output: {out / 'A.log'}")
    b_argv = policy_argv(paths, out / "B", args.updates, args)
    runs["B killed"] = run("B", b_argv, out, kill_at=args.kill_after)
    runs["B resumed"] = run("B", b_argv + ["--resume"], out)
    if args.exact_updates:
        runs["C"] = run("C", policy_argv(paths, out / "C", args.exact_updates, args) + ["--exact-ranks"], out)
    a, b, c = rows(out / "A"), rows(out / "B"), rows(out / "C") if args.exact_updates else []
    report = [f"# benchmarks/full_size.py --out {out}{' --bf16' if args.bf16 else ''}{' --small' if args.small else ''}", ""]
    for name, run_rows in (("A", a), ("B resumed", b), ("C (--exact-ranks)", c)):
        if name.split(" (")[0] in runs:
            report += summary(name, runs[name.split(" (")[0]], run_rows, args.save_interval)
    steps = f"{b[0]['step']}..{b[-1]['step']}" if b else "none"
    report.append(f"- B was killed at {runs['B killed'].get('killed', float('nan')):.1f} s, after {args.kill_after} "
                  f"updates were logged; resumed, its metrics hold updates {steps}")
    report.append("- B (killed, resumed) against A, largest |difference| over all updates: " +
                  ", ".join(f"{k} {v:.2e}" for k, v in largest_differences(a, b)))
    if c:
        report.append("- C (--exact-ranks) against A over its updates, largest |difference|: " +
                      ", ".join(f"{k} {v:.2e}" for k, v in largest_differences(c, a)))
    text = "\n".join(report) + "\n"
    (out / "report.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
