"""Our runs' final values against the public baseline's seed band, and a warning for every setting that differs.

    python benchmarks/compare.py --task sentiment                  # runs/policy_sentiment_seed* vs the approx table
    python benchmarks/compare.py --task sentiment --baseline DIR   # ... vs the baseline's runs cached by openrlbenchmark

The baseline is the W&B project openrlbenchmark/lm-human-preferences. Its runs were not made by OpenAI in 2019:
Costa Huang ran OpenAI's original TF code in 2023 from his fork vwxyzjn/lm-human-preferences (branch poetry), with
Hugging Face `bookcorpus` sentences as the books queries (start and end text None), `webis/tldr-17` as the tldr
queries, per-rank shuffle seeds, OpenAI's label files, GPT-2 124M, fp32 on GPUs, about 10 seeds per task, logged
through TensorBoard synced to W&B. Our settings that reproduce it: --task.query-dataset bookcorpus (sentiment,
descriptiveness) or tldr-17 (tldr), --no-tf32, and no --bf16.

--baseline approx (default): benchmarks/data/oai_baseline_approx.csv, the baseline's curves read off its charts:
  final = the last row (<= --at-step), band = that row's band, std ~ (band_high - band_low) / 4.
--baseline DIR: the baseline's runs (task_id = TASK, initial model 124M) as `openrlbenchmark.rlops_multi_metrics
  --scan-history` caches them (DIR/<run id>/run.json, run_df.csv), at PPO update = _step - the run's first ppo/ _step
  (the reward model's batches come first in their history); band = min..max of the runs' finals.
--ours: run directories: metrics.jsonl (step = PPO update), and config.json (else policy/hparams.json), whose task,
  query source, TF32 and bf16 are checked against the baseline's. Final of a run = mean of its last K values.
Verdict: inside when our mean over runs lies in the baseline's band; diff = (ours - baseline) / baseline std.
Curves: a PNG beside the report (--out runs/compare.md -> runs/compare.png), one panel per task and --check metric:
  each of our runs thin, their mean thick, over the baseline's band (approx: the table's band; cache: min..max of
  its runs) and mean; x = PPO update.
Files: the report and the PNG are written only where no file is, or over the report and PNG an earlier compare.py
  wrote (the report's first line is REPORT_MARK, the PNG's text chunk names the project); a file of yours, or a link,
  at either path is refused in one line, and nothing is written (docs/runs.md).
Exit status: 0 when every --check metric is inside, 1 when one is outside, 2 for bad input or data ("error: ...").
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the package sits at the repository root

from lm_human_preference_details.run.plots import (  # noqa: E402
    BadMetricsRow,
    Panel,
    as_curves,
    comparison_figure,
    is_our_png,
    mean_curve,
    read_curves,
    save_figure,
)
from lm_human_preference_details.utils.checks import check_utf8_path, expand_home  # noqa: E402
from lm_human_preference_details.utils.errors import UserError, run_main  # noqa: E402
from lm_human_preference_details.utils.outputs import new_or_ours  # noqa: E402

APPROX_CSV = Path(__file__).resolve().parent / "data" / "oai_baseline_approx.csv"
# the curves that say whether a run behaves like the baseline (docs/FIDELITY.md, section F: the original's names)
METRICS = ["ppo/objective/score", "ppo/objective/kl", "ppo/objective/entropy", "ppo/objective/kl_coef",
           "ppo/objective/score_total"]
CHECK = ["ppo/objective/score", "ppo/objective/kl", "ppo/objective/entropy"]
BASELINE_MODEL = "124M"
# the baseline's query sources (vwxyzjn/lm-human-preferences, branch poetry), as our --task.query-dataset names them
BASELINE_QUERY_DATASET = {"sentiment": "bookcorpus", "descriptiveness": "bookcorpus", "tldr": "tldr-17"}
# the report's first line: how a later run knows the file is one it may rewrite (an HTML comment: not rendered)
REPORT_MARK = "<!-- written by benchmarks/compare.py, which rewrites this file when run again with the same --out -->"

Series = dict[str, tuple[np.ndarray, np.ndarray]]  # metric -> (steps, values), sorted by step


@dataclass
class Final:
    """One side's final value of a metric: mean and std over runs, the band, the latest step used."""
    mean: float
    std: float
    low: float
    high: float
    step: int


def read_metrics_jsonl(path: Path) -> Series:
    """Every scalar of a Tracker's metrics.jsonl (plots.read_curves)."""
    if not path.is_file():
        raise UserError(f"{path.parent} holds no {path.name}")
    try:
        return read_curves(path)
    except BadMetricsRow as e:
        raise UserError(f"{path}:{e.line}: not a row of scalars with a step (or not UTF-8); fix or delete that line") from None
    except OSError as e:
        raise UserError(f"cannot read {path} ({e.strerror or e})") from None


def unwrap(node):
    """W&B's {'value': v, 'desc': ...} -> v; anything else as it is."""
    return node["value"] if isinstance(node, dict) and "value" in node and set(node) <= {"value", "desc"} else node


def config_lookup(config: dict, dotted: str):
    """config['a']['b'] for 'a.b', unwrapping W&B's values; None when absent."""
    node = config
    for part in dotted.split("."):
        node = unwrap(node)
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return unwrap(node)


def read_run_config(run_dir: Path) -> Optional[dict]:
    """The run's saved config: config.json at the top of the run directory, else the policy's hparams.json."""
    for path in (run_dir / "config.json", run_dir / "policy" / "hparams.json"):
        if path.is_file():
            try:
                return json.loads(path.read_text())
            except ValueError:
                raise UserError(f"{path} is not JSON") from None
    return None


def config_warnings(run_dir: Path, config: Optional[dict], task: str) -> list[str]:
    """One line per setting of the run that differs from the baseline's: task, query source, TF32, bf16."""
    if config is None:
        return [f"{run_dir}: no config.json or policy/hparams.json; its settings cannot be checked against the baseline's"]
    out = []
    task_name = config_lookup(config, "task_name")
    if task_name is not None and task_name != task:
        out.append(f"{run_dir}: task_name is {task_name!r}, compared with the baseline's {task!r} runs")
    dataset, wanted = config_lookup(config, "task.query_dataset"), BASELINE_QUERY_DATASET.get(task)
    if dataset is not None and wanted is not None and dataset != wanted:
        words = {"books-2019": " (2019 passages)", "tldr-2019": " (2019 subset)", "books": " (2019 passages)",
                 "tldr": " (2019 subset)"}.get(dataset, "")  # the last two: runs made before the sources were renamed
        out.append(f"{run_dir}: task.query_dataset is {dataset!r}{words}, the baseline used {wanted!r}; "
                   "curves may differ because of the data")
    if config_lookup(config, "tf32") is True:
        out.append(f"{run_dir}: tf32 is True (TF32 matmuls on CUDA), the baseline ran in full fp32 (--no-tf32); "
                   "curves may differ because of the numerics")
    if config_lookup(config, "bf16") is True:
        out.append(f"{run_dir}: bf16 is True (bfloat16 autocast), the baseline ran in fp32 (no --bf16); "
                   "curves may differ because of the numerics")
    return out


def read_ours(pattern: str, task: str) -> tuple[dict[str, Series], list[str]]:
    """Our run directories matching ``pattern``: run name -> series, and the config warnings."""
    dirs = sorted(Path(p) for p in glob.glob(pattern.replace("{task}", task)) if Path(p).is_dir())
    if not dirs:
        raise UserError(f"no run directory matches {pattern.replace('{task}', task)}")
    runs, warnings = {}, []
    for d in dirs:
        runs[d.name] = read_metrics_jsonl(d / "metrics.jsonl")
        warnings += config_warnings(d, read_run_config(d), task)
    return runs, warnings


def read_baseline_cache(cache: Path, task: str, metrics: list[str]) -> dict[str, Series]:
    """The baseline's runs of ``task`` from openrlbenchmark's cache, ppo/ steps moved to PPO updates."""
    runs = {}
    for run_json in sorted(cache.glob("*/run.json")):
        points: dict[str, dict[int, float]] = {}
        try:
            config = json.loads(run_json.read_text()).get("config", {})
            model = str(config_lookup(config, "task.policy.initial_model"))
            if config_lookup(config, "task_id") != task or model != BASELINE_MODEL:
                continue
            with open(run_json.parent / "run_df.csv", newline="") as f:
                for row in csv.DictReader(f):
                    for m in metrics:
                        if row.get(m):
                            points.setdefault(m, {})[int(float(row["_step"]))] = float(row[m])
        except (OSError, ValueError, KeyError, AttributeError, OverflowError) as e:  # ValueError: bad bytes too
            raise UserError(f"{run_json.parent}: not a run cached by openrlbenchmark ({type(e).__name__}: {e})") from None
        # the reward model's batches come first in the same history (156 for books, 2875 for tldr), then PPO
        first_ppo = min((s for m, p in points.items() if m.startswith("ppo/") for s in p), default=0)
        shift = {m: first_ppo if m.startswith("ppo/") else 0 for m in points}
        runs[run_json.parent.name] = as_curves({m: {s - shift[m]: v for s, v in p.items()} for m, p in points.items()})
    if not runs:
        raise UserError(f"{cache} caches no run with task_id {task!r} and initial model {BASELINE_MODEL}")
    return runs


def runs_final(runs: dict[str, Series], metric: str, last_k: int, at_step: Optional[int], band: bool) -> Final:
    """Mean and sample std over runs of each run's mean of its last ``last_k`` values; band = min..max."""
    finals, last = [], []
    for name, series in sorted(runs.items()):
        if metric not in series:
            raise UserError(f"run {name} logs no {metric}")
        steps, values = series[metric]
        keep = steps <= at_step if at_step is not None else np.ones(len(steps), bool)
        if not keep.any():
            raise UserError(f"run {name} logs no {metric} at step <= {at_step}")
        finals.append(values[keep][-last_k:].mean())
        last.append(int(steps[keep][-1]))
    f = np.array(finals)
    std = float(f.std(ddof=1)) if len(f) > 1 else math.nan
    low, high = (float(f.min()), float(f.max())) if band else (math.nan, math.nan)
    return Final(float(f.mean()), std, low, high, max(last))


def read_approx(path: Path, task: str) -> dict[str, list[tuple[int, float, float, float]]]:
    """The approx table's rows of ``task``: metric -> [(step, mean, band_low, band_high)] by step."""
    table: dict[str, list] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["task"] == task:
                band = [float(row[k]) if row[k] else math.nan for k in ("band_low", "band_high")]
                table.setdefault(row["metric"], []).append((int(row["step"]), float(row["value_mean"]), *band))
    if not table:
        raise UserError(f"the approx table {path.name} has no rows for task {task!r}")
    return {m: sorted(rows) for m, rows in table.items()}


def approx_final(table: dict, metric: str, at_step: Optional[int]) -> Final:
    """The row at the last step (<= at_step); std = (band_high - band_low) / 4."""
    rows = [r for r in table.get(metric, []) if at_step is None or r[0] <= at_step]
    if not rows:
        raise UserError(f"the approx table has no {metric}" + (f" at step <= {at_step}" if at_step is not None else ""))
    step, mean, low, high = rows[-1]
    return Final(mean, (high - low) / 4, low, high, step)


def fmt(x: float) -> str:
    return "n/a" if not math.isfinite(x) else f"{x:.4g}"


def approx_panel(title: str, ours: dict[str, Series], metric: str, table: dict) -> Panel:
    """A panel of our runs over the approx table's mean and band (the rows that have one)."""
    rows = np.array(table.get(metric, []), dtype=float).reshape(-1, 4)  # [rows, (step, mean, low, high)]
    banded = rows[np.isfinite(rows[:, 2]) & np.isfinite(rows[:, 3])]
    return Panel(title, {name: series[metric] for name, series in ours.items()}, (rows[:, 0], rows[:, 1]),
                 (banded[:, 0], banded[:, 2], banded[:, 3]) if len(banded) else None, "baseline (approx)")


def cache_panel(title: str, ours: dict[str, Series], metric: str, runs: dict[str, Series]) -> Panel:
    """A panel of our runs over the cached baseline runs' mean and min..max band (at the updates they all logged)."""
    curves = {name: series[metric] for name, series in runs.items() if metric in series}
    steps, mean = mean_curve(curves)
    values = np.array([v[np.searchsorted(s, steps)] for s, v in curves.values()])  # [runs, steps]
    return Panel(title, {name: series[metric] for name, series in ours.items()}, (steps, mean),
                 (steps, values.min(axis=0), values.max(axis=0)), f"baseline ({len(curves)} runs)")


def compare_task(args: argparse.Namespace, task: str) -> tuple[list[str], list[str], list[tuple[str, str]], list[Panel]]:
    """(markdown lines, warnings, [(metric, verdict)], a plot panel per checked metric) for one task."""
    ours, warnings = read_ours(args.ours, task)
    if args.baseline == "approx":
        table, what = read_approx(APPROX_CSV, task), f"the approx table ({APPROX_CSV.name})"
        baseline = {m: approx_final(table, m, args.at_step) for m in args.metrics}
        panel = lambda m: approx_panel(f"{task} {m}", ours, m, table)  # noqa: E731
    else:
        runs = read_baseline_cache(Path(args.baseline), task, args.metrics)
        what = f"{len(runs)} runs cached in {args.baseline}"
        baseline = {m: runs_final(runs, m, args.last_k, args.at_step, band=True) for m in args.metrics}
        panel = lambda m: cache_panel(f"{task} {m}", ours, m, runs)  # noqa: E731
    lines = [f"### {task}", "", f"ours: {len(ours)} runs ({args.ours.replace('{task}', task)}); baseline: {what}", "",
             ("| metric | ours: mean ± std | baseline: mean ± std | baseline band | diff (baseline std) | "
              "final at step (ours / baseline) | verdict |"), "|---|---|---|---|---|---|---|"]
    verdicts = []
    for metric in args.metrics:
        a, b = runs_final(ours, metric, args.last_k, args.at_step, band=False), baseline[metric]
        if args.at_step is None and abs(a.step - b.step) > 0.05 * max(a.step, b.step):
            warnings.append(f"{task} {metric}: our runs end at step {a.step}, the baseline at {b.step}; "
                            "--at-step compares at one step")
        diff = (a.mean - b.mean) / b.std if b.std > 0 else math.nan
        verdict = "no band" if math.isnan(b.low) else "inside" if b.low <= a.mean <= b.high else "outside"
        verdicts.append((metric, verdict))
        lines.append(f"| {metric} | {fmt(a.mean)} ± {fmt(a.std)} | {fmt(b.mean)} ± {fmt(b.std)} | [{fmt(b.low)}, "
                     f"{fmt(b.high)}] | {fmt(diff)} | {a.step} / {b.step} | "
                     f"{verdict}{'' if metric in args.check else ' (not checked)'} |")
    return lines + [""], warnings, verdicts, [panel(m) for m in args.check]  # every run logs them: checked above


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not argparse's usage dump
        raise UserError(message)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = Parser(prog="compare.py", description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n", 1)[1],
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", nargs="+", required=True, help="sentiment, descriptiveness, tldr")
    p.add_argument("--baseline", default="approx", help="approx (default) or openrlbenchmark's cache directory")
    p.add_argument("--ours", default="runs/policy_{task}_seed*", help="run directory glob (default runs/policy_{task}_seed*)")
    p.add_argument("--metrics", nargs="+", default=METRICS, help="'score' means ppo/objective/score (default: 5 keys)")
    p.add_argument("--check", nargs="+", default=CHECK, help="metrics that set the exit status (default score kl entropy)")
    p.add_argument("--last-k", type=int, default=10, help="final = mean of each run's last K values (default 10)")
    p.add_argument("--at-step", type=int, default=None, help="compare at PPO update N instead of the end")
    p.add_argument("--out", default="runs/compare.md", help="the markdown report (default runs/compare.md)")
    args = p.parse_args(argv)
    args.baseline, args.ours, args.out = map(expand_home, (args.baseline, args.ours, args.out))  # `--out=~/x.md` too
    full = {m: m if "/" in m else f"ppo/objective/{m}" for m in [*args.metrics, *args.check]}  # 'score' is short
    args.check = list(dict.fromkeys(full[m] for m in args.check))
    args.metrics = list(dict.fromkeys([*(full[m] for m in args.metrics), *args.check]))
    if args.last_k < 1:
        raise UserError(f"--last-k must be >= 1 (got {args.last_k})")
    if args.baseline != "approx" and not Path(args.baseline).is_dir():
        raise UserError(f"--baseline {args.baseline!r}: expected approx or openrlbenchmark's cache directory")
    check_out(args.out)
    return args


def check_out(path: str) -> None:
    """--out names a markdown file that can be written, in a directory or beneath one that can be made, whose report
    and PNG paths hold nothing or what compare.py wrote there before. Writes nothing."""
    out = Path(path)
    check_utf8_path("--out", out.absolute(), "the report names its PNG in UTF-8 text")
    if out.suffix == ".png":
        raise UserError(f"--out {path}: pass the markdown report's path (e.g. runs/compare.md); the PNG is written beside it")
    if out.is_dir():
        raise UserError(f"--out {path} is a directory; pass a file path in it, e.g. {out / 'compare.md'}")
    existing = out.absolute().parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"--out {path} lies under the file {existing}; pass a path in a directory")
    if not os.access(existing, os.W_OK):
        raise UserError(f"--out {path}: {existing} cannot be written; pass a path in a writable directory")
    for target, ours in ((out, is_our_report), (out.with_suffix(".png"), is_our_png)):
        if os.path.lexists(target) and (target.is_symlink() or not target.is_file() or not ours(target)):
            raise not_ours(path, target)


def is_our_report(path: Path) -> bool:
    """Whether ``path`` is a report compare.py wrote: its first line is REPORT_MARK."""
    with open(path, "rb") as f:
        return f.readline(len(REPORT_MARK) + 2).rstrip(b"\n") == REPORT_MARK.encode()


def not_ours(out: str | Path, target: Path) -> UserError:
    """The line that refuses to write over ``target``, which compare.py did not write (or which is a link)."""
    what = "a symbolic link" if target.is_symlink() else "not a file compare.py wrote" if target.is_file() else "not a file"
    return UserError(f"--out {out}: {target} exists and is {what}; compare.py never replaces or writes through it: "
                     f"pass another --out, or move {target} away (also a report from a compare.py older than its mark line)")


def write_outputs(out: Path, report: list[str], panels: list[Panel], columns: int) -> None:
    """The PNG, then the markdown report beside it, each only where nothing is or over what compare.py wrote there
    (checked again right before each file is put in place: outputs.new_or_ours); an OS error (disk full, permissions)
    is one line."""
    try:
        with new_or_ours(out.with_suffix(".png"), is_our_png) as tmp:
            save_figure(comparison_figure(panels, columns), tmp)
        with new_or_ours(out, is_our_report) as tmp:
            tmp.write_text("\n".join([REPORT_MARK, *report]) + "\n")
    except FileExistsError as e:  # a file of the user's appeared at either path while we compared
        raise not_ours(out, Path(e.filename)) from None
    except OSError as e:
        raise UserError(f"cannot write --out {out} ({e.strerror or e}); pass a writable path") from None


def main(argv: Optional[list[str]] = None) -> int:
    """Compare every task, print and write the report; the exit status says whether we are inside the band."""
    args = parse_args(argv)
    report, warnings, verdicts, panels = [], [], [], []
    for task in args.task:
        lines, task_warnings, task_verdicts, task_panels = compare_task(args, task)
        report += lines
        warnings += task_warnings
        verdicts += [(f"{task} {m}", v) for m, v in task_verdicts if m in args.check]
        panels += task_panels
    outside = [name for name, v in verdicts if v == "outside"]
    no_band = [name for name, v in verdicts if v == "no band"]
    summary = ("no band for " + ", ".join(no_band) if no_band else
               "outside: " + ", ".join(outside) if outside else "all inside the baseline's band")
    png = Path(args.out).with_suffix(".png")
    report += [f"checked ({', '.join(args.check)}): {summary}",
               f"curves: {png.name} beside this report, panels: {'; '.join(p.title for p in panels)}",
               *(f"warning: {w}" for w in warnings)]
    print(*(f"warning: {w}" for w in warnings), sep="\n", file=sys.stderr, end="\n" if warnings else "")
    write_outputs(Path(args.out), report, panels, columns=len(args.check))
    print("\n".join(report))
    if no_band:
        raise UserError(f"the baseline has no band for {', '.join(no_band)}: no verdict possible")
    return 1 if outside else 0


if __name__ == "__main__":
    run_main(lambda: sys.exit(main()))
