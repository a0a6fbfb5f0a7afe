"""benchmarks/compare.py on synthetic runs (numbers worked out by hand, verdicts, exit statuses, config warnings)
and benchmarks/slurm_array.sbatch run as one array element. No network."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from helpers.errors import assert_one_error_line

from benchmarks import compare

ROOT = Path(__file__).resolve().parents[2]
SCORE, KL, ENTROPY = "ppo/objective/score", "ppo/objective/kl", "ppo/objective/entropy"
# the baseline's settings, as our config records them
BASELINE_CONFIG = {"task_name": "sentiment", "tf32": False, "bf16": False, "task": {"query_dataset": "bookcorpus"}}

# Our two seeds, 5 updates each; with --last-k 2 each final is the mean of updates 3 and 4.
OURS = {
    "policy_sentiment_seed1": {SCORE: [0, 0, 0, 1.0, 2.0], KL: [0, 0, 0, 7.0, 7.0], ENTROPY: [50, 50, 50, 40.0, 40.0]},
    "policy_sentiment_seed2": {SCORE: [0, 0, 0, 2.0, 3.0], KL: [0, 0, 0, 9.0, 9.0], ENTROPY: [50, 50, 50, 42.0, 42.0]},
}
# finals: score 1.5, 2.5 -> 2 +- 0.70711; kl 7, 9 -> 8 +- 1.41421; entropy 40, 42 -> 41 +- 1.41421

# The baseline's three runs as W&B logged them: 156 reward batches at _step 0..155, then PPO updates 0..4 at 156..160.
BASELINE = {
    "runA": {SCORE: [0, 0, 0, 1.0, 1.0], KL: [0, 0, 0, 5.0, 5.0], ENTROPY: [50, 50, 50, 40.0, 40.0]},
    "runB": {SCORE: [0, 0, 0, 2.0, 2.0], KL: [0, 0, 0, 6.0, 6.0], ENTROPY: [50, 50, 50, 41.0, 41.0]},
    "runC": {SCORE: [0, 0, 0, 3.0, 3.0], KL: [0, 0, 0, 7.0, 7.0], ENTROPY: [50, 50, 50, 45.0, 45.0]},
}
# finals: score 1, 2, 3 -> 2 +- 1, band [1, 3]; kl 5, 6, 7 -> 6 +- 1, band [5, 7];
# entropy 40, 41, 45 -> 42 +- sqrt(((-2)^2 + (-1)^2 + 3^2) / 2) = sqrt(7), band [40, 45]
OFFSET = 156


def write_run(run_dir: Path, series: dict[str, list[float]], config: dict | None = BASELINE_CONFIG,
              where: str = "config.json") -> Path:
    """A run directory as train_policy.py writes it: metrics.jsonl and its saved config."""
    run_dir.mkdir(parents=True)
    n = len(next(iter(series.values())))
    rows = [{"step": u, **{m: v[u] for m, v in series.items()}} for u in range(n)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if config is not None:
        (run_dir / where).parent.mkdir(exist_ok=True)
        (run_dir / where).write_text(json.dumps(config))
    return run_dir


def write_cached_run(cache: Path, run_id: str, series: dict[str, list[float]], config: dict) -> None:
    """A run as openrlbenchmark's CachedRun stores it: run.json (W&B attributes) and scan_history() as a CSV."""
    rows = [{"_step": s, "train_reward/minibatch/loss": 1.5} for s in range(OFFSET)]
    n = len(next(iter(series.values())))
    rows += [{"_step": OFFSET + u, **{m: v[u] for m, v in series.items()}} for u in range(n)]
    (cache / run_id).mkdir(parents=True)
    pd.DataFrame(rows).to_csv(cache / run_id / "run_df.csv")
    (cache / run_id / "run.json").write_text(json.dumps({"id": run_id, "state": "finished", "config": config}))


@pytest.fixture
def setup(tmp_path):
    """Our runs in tmp/runs, the baseline's in an openrlbenchmark cache tmp/cache; returns the common argv."""
    for name, series in OURS.items():
        write_run(tmp_path / "runs" / name, series)
    model = {"policy": {"initial_model": "124M"}}
    for run_id, series in BASELINE.items():
        write_cached_run(tmp_path / "cache", run_id, series, {"task_id": "sentiment", "task": model})
    big = {"task_id": "sentiment", "task": {"policy": {"initial_model": "774M"}}}
    write_cached_run(tmp_path / "cache", "big", BASELINE["runA"], big)
    desc = {"task_id": {"value": "descriptiveness"}, "task": {"value": model}}
    write_cached_run(tmp_path / "cache", "desc", {SCORE: [9.0] * 5}, desc)
    return tmp_path, ["--task", "sentiment", "--ours", str(tmp_path / "runs" / "policy_{task}_seed*"), "--baseline",
                      str(tmp_path / "cache"), "--last-k", "2", "--out", str(tmp_path / "out.md"),
                      "--metrics", "score", "kl", "entropy"]


def table_rows(text: str) -> dict[str, list[str]]:
    """metric -> the cells of its markdown row."""
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines() if line.startswith("| ppo/")]
    return {c[0]: c[1:] for c in cells}


def test_table_numbers_by_hand(setup, capsys):
    tmp, argv = setup
    assert compare.main([*argv, "--check", "score", "entropy"]) == 0
    out = capsys.readouterr()
    rows = table_rows((tmp / "out.md").read_text())
    assert rows == table_rows(out.out)
    # ours, baseline, band, diff, final steps (PPO updates: _step 160 -> 4), verdict; 774M and descriptiveness left out
    assert rows[SCORE] == ["2 ± 0.7071", "2 ± 1", "[1, 3]", "0", "4 / 4", "inside"]
    assert rows[KL] == ["8 ± 1.414", "6 ± 1", "[5, 7]", "2", "4 / 4", "outside (not checked)"]
    # entropy: (41 - 42) / sqrt(7) = -0.37796
    assert rows[ENTROPY] == ["41 ± 1.414", "42 ± 2.646", "[40, 45]", "-0.378", "4 / 4", "inside"]
    assert "3 runs cached in" in out.out and "all inside the baseline's band" in out.out and out.err == ""


def test_outside_is_status_1_and_at_step(setup, capsys):
    tmp, argv = setup
    assert compare.main(argv) == 1  # default check: score, kl, entropy; kl's 8 is outside [5, 7]
    assert "outside: sentiment ppo/objective/kl" in capsys.readouterr().out
    # --at-step 3, last 1: ours' scores at update 3 are 1 and 2 -> 1.5; the baseline's 1, 2, 3 -> 2
    assert compare.main([*argv, "--at-step", "3", "--last-k", "1", "--check", "score"]) == 0
    assert table_rows((tmp / "out.md").read_text())[SCORE][:5] == ["1.5 ± 0.7071", "2 ± 1", "[1, 3]", "-0.5", "3 / 3"]


def test_baseline_cache_is_aligned_to_ppo_updates(setup):
    tmp, _ = setup
    runs = compare.read_baseline_cache(tmp / "cache", "sentiment", [SCORE, "train_reward/minibatch/loss"])
    assert sorted(runs) == ["runA", "runB", "runC"]
    assert runs["runC"][SCORE][0].tolist() == [0, 1, 2, 3, 4] and runs["runC"][SCORE][1].tolist() == [0, 0, 0, 3, 3]
    assert runs["runA"]["train_reward/minibatch/loss"][0].tolist() == list(range(OFFSET))  # keeps its batch index


def use_approx_table(tmp_path, monkeypatch) -> None:
    """A small approximate baseline table (score at updates 0, 3, 4; bands at 3 and 4) in place of the shipped one."""
    approx = tmp_path / "approx.csv"
    approx.write_text("task,metric,step,value_mean,band_low,band_high\n"
                      "sentiment,ppo/objective/score,0,-0.6,,\n"
                      "sentiment,ppo/objective/score,3,1.5,1.2,1.8\n"
                      "sentiment,ppo/objective/score,4,2.0,1.0,3.0\n")
    monkeypatch.setattr(compare, "APPROX_CSV", approx)


def test_approx_table_std_stand_in_and_verdicts(tmp_path, monkeypatch):
    use_approx_table(tmp_path, monkeypatch)
    for seed in (1, 2):
        write_run(tmp_path / "runs" / f"policy_sentiment_seed{seed}", {SCORE: [0, 0, 0, 2.4, 2.8]})
    argv = ["--task", "sentiment", "--ours", str(tmp_path / "runs" / "policy_{task}_seed*"), "--metrics", "score",
            "--check", "score", "--last-k", "2", "--out", str(tmp_path / "out.md")]
    # ours: 2.6 +- 0; the baseline at step 4: 2.0, band [1, 3], std (3 - 1) / 4 = 0.5 -> diff 1.2, inside
    assert compare.main(argv) == 0
    assert table_rows((tmp_path / "out.md").read_text())[SCORE] == ["2.6 ± 0", "2 ± 0.5", "[1, 3]", "1.2", "4 / 4", "inside"]
    # at step 3 (last 1 value): ours 2.4 vs 1.5 in [1.2, 1.8], std (1.8 - 1.2) / 4 = 0.15 -> diff 6, outside
    assert compare.main([*argv, "--at-step", "3", "--last-k", "1"]) == 1
    expected = ["2.4 ± 0", "1.5 ± 0.15", "[1.2, 1.8]", "6", "3 / 3", "outside"]
    assert table_rows((tmp_path / "out.md").read_text())[SCORE] == expected


def test_shipped_approx_table(tmp_path, capsys):
    """benchmarks/data holds the baseline's approximate curves, with a band at the end for the books tasks."""
    for task in ("sentiment", "descriptiveness"):
        table = compare.read_approx(compare.APPROX_CSV, task)
        for metric in compare.METRICS:
            step, mean, low, high = table[metric][-1]
            assert step == 1950 and low < mean < high
    assert compare.approx_final(compare.read_approx(compare.APPROX_CSV, "sentiment"), SCORE, None).mean == 1.852
    # no band for tldr (ours: mean of 0.5 and 0.7): the table is written, no verdict is possible -> one error line, status 2
    write_run(tmp_path / "runs" / "policy_tldr_seed1", {m: [0.5, 0.7] for m in compare.METRICS},
              {**BASELINE_CONFIG, "task_name": "tldr", "task": {"query_dataset": "tldr-17"}})
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), "--task", "tldr",
                             "--ours", str(tmp_path / "runs" / "policy_{task}_seed*"), "--out", str(tmp_path / "out.md")],
                            capture_output=True, text=True, timeout=120)
    line = assert_one_error_line(result, alone=False)
    assert line.startswith("error: the baseline has no band for tldr ppo/objective/score")
    assert table_rows((tmp_path / "out.md").read_text())[SCORE] == ["0.6 ± n/a", "0.7509 ± n/a", "[n/a, n/a]", "n/a",
                                                                   "1 / 31250", "no band"]


@pytest.mark.parametrize("config, where, expected", [
    (BASELINE_CONFIG, "config.json", []),
    ({**BASELINE_CONFIG, "task": {"query_dataset": "books-2019"}}, "config.json",
     ["task.query_dataset is 'books-2019' (2019 passages), the baseline used 'bookcorpus'; "
      "curves may differ because of the data"]),
    ({**BASELINE_CONFIG, "task": {"query_dataset": "books"}}, "config.json",
     ["task.query_dataset is 'books' (2019 passages), the baseline used 'bookcorpus'; curves may differ because of the data"]),
    ({**BASELINE_CONFIG, "tf32": True}, "policy/hparams.json",
     ["tf32 is True (TF32 matmuls on CUDA), the baseline ran in full fp32 (--no-tf32); "
      "curves may differ because of the numerics"]),
    ({**BASELINE_CONFIG, "bf16": True}, "config.json",
     ["bf16 is True (bfloat16 autocast), the baseline ran in fp32 (no --bf16); curves may differ because of the numerics"]),
    ({**BASELINE_CONFIG, "task_name": "descriptiveness"}, "config.json",
     ["task_name is 'descriptiveness', compared with the baseline's 'sentiment' runs"]),
    ({"task_name": "sentiment", "tf32": True, "bf16": True, "task": {"query_dataset": "my.jsonl"}}, "config.json",
     ["task.query_dataset is 'my.jsonl', the baseline used 'bookcorpus'", "tf32 is True", "bf16 is True"]),
    (None, "config.json", ["no config.json or policy/hparams.json; its settings cannot be checked against the baseline's"]),
])
def test_config_warnings_one_line_per_difference(setup, capsys, config, where, expected, monkeypatch):
    """(The curves beside the report are a blank figure here, written as compare.py writes its PNG: these cases read
    the warnings; the panels are tested below. Drawing them was two thirds of each case.)"""
    from matplotlib.figure import Figure

    monkeypatch.setattr(compare, "comparison_figure", lambda panels, columns: Figure(figsize=(1, 1)))
    tmp, argv = setup
    run = write_run(tmp / "runs" / "policy_sentiment_seed3", OURS["policy_sentiment_seed1"], config, where)
    compare.main(argv)
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(err) == len(expected)
    for line, text in zip(err, expected):
        assert line.startswith(f"warning: {run}: {text}")
    assert [line for line in (tmp / "out.md").read_text().splitlines() if line.startswith("warning:")] == err


def test_config_json_comes_before_hparams(tmp_path):
    run = write_run(tmp_path / "run", {SCORE: [1.0]}, {**BASELINE_CONFIG, "bf16": True}, "policy/hparams.json")
    assert len(compare.config_warnings(run, compare.read_run_config(run), "sentiment")) == 1
    (run / "config.json").write_text(json.dumps(BASELINE_CONFIG))
    assert compare.config_warnings(run, compare.read_run_config(run), "sentiment") == []


def test_runs_ending_at_different_steps_warn(setup, capsys):
    tmp, argv = setup
    write_run(tmp / "short" / "policy_sentiment_seed1", {m: v[:2] for m, v in OURS["policy_sentiment_seed1"].items()})
    compare.main([*argv, "--ours", str(tmp / "short" / "policy_{task}_seed*"), "--metrics", "score", "--check", "score"])
    assert "warning: sentiment ppo/objective/score: our runs end at step 1, the baseline at 4" in capsys.readouterr().err


@pytest.mark.parametrize("case, message", [
    ("no_runs", "error: no run directory matches"),
    ("metric_missing", "error: run policy_sentiment_seed2 logs no ppo/objective/kl"),
    ("approx_task", "error: the approx table oai_baseline_approx.csv has no rows for task 'cnndm'"),
    ("cache_task", "caches no run with task_id 'tldr' and initial model 124M"),
    ("no_metrics_jsonl", "policy_sentiment_seed3 holds no metrics.jsonl"),
    ("bad_metrics_row", "metrics.jsonl:6: not a row of scalars with a step"),
    ("bad_config", "config.json is not JSON"),
    ("bad_cache", "runB: not a run cached by openrlbenchmark (FileNotFoundError"),
    ("bad_baseline", "error: --baseline 'nowhere': expected approx or openrlbenchmark's cache directory"),
    ("bad_arg", "error: argument --last-k: invalid int value"),
    ("out_under_file", "lies under the file"),
    ("out_is_dir", "is a directory; pass a file path in it"),
    ("out_is_png", "pass the markdown report's path"),
])
def test_bad_input_is_one_line_status_2(setup, case, message):
    tmp, argv = setup
    if case == "no_runs":
        argv += ["--ours", str(tmp / "nowhere_{task}")]
    elif case == "metric_missing":
        (tmp / "runs" / "policy_sentiment_seed2" / "metrics.jsonl").write_text(json.dumps({"step": 0, SCORE: 1.0}) + "\n")
    elif case in ("approx_task", "cache_task"):
        task = "cnndm" if case == "approx_task" else "tldr"
        write_run(tmp / "runs" / f"policy_{task}_seed1", OURS["policy_sentiment_seed1"])
        argv += ["--task", task] + (["--baseline", "approx"] if case == "approx_task" else [])
    elif case == "no_metrics_jsonl":
        (tmp / "runs" / "policy_sentiment_seed3").mkdir()
    elif case == "bad_metrics_row":
        with open(tmp / "runs" / "policy_sentiment_seed1" / "metrics.jsonl", "a") as f:  # after the 5 good rows
            f.write(json.dumps({"step": 0, SCORE: "a table"}) + "\n")
    elif case == "bad_config":
        (tmp / "runs" / "policy_sentiment_seed1" / "config.json").write_text("{task_name")
    elif case == "bad_cache":
        (tmp / "cache" / "runB" / "run_df.csv").unlink()
    elif case == "bad_baseline":
        argv += ["--baseline", "nowhere"]
    elif case == "bad_arg":
        argv += ["--last-k", "many"]
    elif case == "out_under_file":
        argv += ["--out", str(tmp / "runs" / "policy_sentiment_seed1" / "metrics.jsonl" / "report.md")]
    elif case == "out_is_dir":
        argv += ["--out", str(tmp / "runs")]
    elif case == "out_is_png":
        argv += ["--out", str(tmp / "compare.png")]
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "compare.py"), *argv], capture_output=True,
                            text=True, timeout=120, cwd=tmp)
    assert_one_error_line(result, message)


def drawn_panels(monkeypatch) -> list:
    """Record the figures compare.py saves (then saved as usual)."""
    figures = []
    real = compare.save_figure
    monkeypatch.setattr(compare, "save_figure", lambda fig, path: figures.append(fig) or real(fig, path))
    return figures


def assert_png(path: Path) -> tuple[int, int]:
    """``path`` is a PNG file that decodes; its (height, width)."""
    import matplotlib.image

    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return matplotlib.image.imread(path).shape[:2]


def test_curves_png_beside_the_report_with_a_panel_per_checked_metric(setup, monkeypatch, capsys):
    tmp, argv = setup
    figures = drawn_panels(monkeypatch)
    compare.main([*argv, "--check", "score", "kl", "entropy"])
    height, width = assert_png(tmp / "out.png")
    assert width > 2 * height  # three panels side by side
    titles = [f"sentiment {m}" for m in (SCORE, KL, ENTROPY)]
    report = (tmp / "out.md").read_text()
    assert f"curves: out.png beside this report, panels: {'; '.join(titles)}" in report.splitlines()
    axes = [ax for ax in figures[0].axes if ax.get_visible()]
    assert [ax.get_title() for ax in axes] == titles and all(ax.get_xlabel() == "PPO update" for ax in axes)
    score = {line.get_label(): line for line in axes[0].get_lines()}
    # each of our runs thin, their mean thick; the three cached baseline runs' mean, dashed
    assert score["ours, mean of 2"].get_ydata().tolist() == [0, 0, 0, 1.5, 2.5]
    assert score["ours, mean of 2"].get_linewidth() > 2 * score["ours, each run"].get_linewidth()
    assert score["baseline (3 runs) mean"].get_xdata().tolist() == [0, 1, 2, 3, 4]
    assert score["baseline (3 runs) mean"].get_ydata().tolist() == [0, 0, 0, 2, 2]
    band = axes[0].collections[0].get_paths()[0].vertices  # min..max of the baseline's runs at updates 3 and 4: 1..3
    assert band[:, 1].min() == 0 and band[:, 1].max() == 3 and {1.0, 3.0} <= set(band[band[:, 0] == 4, 1].tolist())


def test_curves_over_the_approx_table(tmp_path, monkeypatch):
    use_approx_table(tmp_path, monkeypatch)
    figures = drawn_panels(monkeypatch)
    write_run(tmp_path / "runs" / "policy_sentiment_seed1", {SCORE: [0, 0, 0, 2.4, 2.8]})
    compare.main(["--task", "sentiment", "--ours", str(tmp_path / "runs" / "policy_{task}_seed*"), "--metrics", "score",
                  "--check", "score", "--out", str(tmp_path / "report" / "out.md")])
    assert_png(tmp_path / "report" / "out.png")
    (ax,) = figures[0].axes
    lines = {line.get_label(): line for line in ax.get_lines()}
    assert lines["baseline (approx) mean"].get_xdata().tolist() == [0, 3, 4]
    assert lines["ours, mean of 1"].get_ydata().tolist() == [0, 0, 0, 2.4, 2.8]
    band = ax.collections[0].get_paths()[0].vertices  # only the rows with a band: updates 3 and 4
    assert set(band[:, 0].tolist()) == {3.0, 4.0} and band[:, 1].min() == 1.0 and band[:, 1].max() == 3.0


def test_slurm_template_runs_the_array_element(tmp_path):
    """slurm_array.sbatch as array element 2: the third task:seed of LMHP_JOBS, with LMHP_ARGS, as one train_policy.py run."""
    fake = tmp_path / "train_policy.py"  # a stand-in that prints its arguments
    fake.write_text("import json, sys; print(json.dumps(sys.argv[1:]))\n")
    (tmp_path / "benchmarks").symlink_to(ROOT / "benchmarks")  # the script sources benchmarks/slurm_stop.sh
    env = {**os.environ, "LMHP_JOBS": "sentiment:1 sentiment:2 tldr:1", "LMHP_ARGS": "--no-tf32 --wandb-project 'my proj'",
           "LMHP_PYTHON": sys.executable, "SLURM_ARRAY_TASK_ID": "2", "SLURM_SUBMIT_DIR": str(tmp_path)}
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "slurm_array.sbatch")], capture_output=True, text=True,
                            timeout=30, env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [
        "--task", "tldr", "--seed", "1", "--output-dir", "runs/policy_tldr_seed1", "--resume", "--no-tf32", "--wandb-project",
        "my proj"]
    result = subprocess.run(["bash", str(ROOT / "benchmarks" / "slurm_array.sbatch")], capture_output=True, text=True,
                            timeout=30, env={**env, "SLURM_ARRAY_TASK_ID": "3"})
    assert result.returncode == 2 and result.stderr.strip() == "error: array index 3, but LMHP_JOBS holds 3 jobs"


# ------------------------------------------------------------------------------ the report and PNG: never over yours
def files_under(root: Path) -> dict[str, bytes | str]:
    """Every entry under ``root``: a file's bytes, a link's target."""
    return {str(p.relative_to(root)): os.readlink(p) if p.is_symlink() else p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_symlink() or p.is_file()}


def refused(capsys, argv) -> str:
    """compare.main(argv) as the script runs it -> its one `error:` line (exit 2, no traceback)."""
    from lm_human_preference_details.utils.errors import run_main

    with pytest.raises(SystemExit) as e:
        run_main(lambda: compare.main(argv))
    return assert_one_error_line(subprocess.CompletedProcess(argv, e.value.code, "", capsys.readouterr().err))


@pytest.mark.parametrize("case", ["my-report", "my-png", "link-to-mine", "link-to-a-report", "old-report"])
def test_an_out_path_holding_a_file_not_ours_is_refused_and_kept(setup, case, capsys):
    tmp, argv = setup
    out, png, mine = tmp / "out.md", tmp / "out.png", tmp / "mine.md"
    compare.main([*argv, "--out", str(tmp / "earlier" / "out.md")])  # a report compare.py wrote, elsewhere
    capsys.readouterr()
    mine.write_text("# my notes\n")
    if case == "my-report":
        out.write_text("# my notes about the runs\n")
    elif case == "my-png":
        png.write_bytes(b"\x89PNG\r\n\x1a\nmy picture")
    elif case == "link-to-mine":
        out.symlink_to(mine)
    elif case == "link-to-a-report":  # a link is never written through, or replaced, even to a file compare.py wrote
        out.symlink_to(tmp / "earlier" / "out.md")
    else:  # a report without the mark (compare.py before it had one): yours to move away
        out.write_text("".join((tmp / "earlier" / "out.md").read_text().splitlines(True)[1:]))
    before = files_under(tmp)
    line = refused(capsys, argv)
    target = png if case == "my-png" else out
    assert line.startswith(f"error: --out {out}: {target} exists and is ") and "pass another --out" in line, line
    assert ("a symbolic link" in line) == case.startswith("link")
    assert files_under(tmp) == before


def test_a_second_run_rewrites_its_own_report_and_png(setup, capsys):
    tmp, argv = setup
    compare.main(argv)
    first = (tmp / "out.md").read_text()
    assert first.splitlines()[0] == compare.REPORT_MARK and compare.is_our_png(tmp / "out.png")
    compare.main([*argv, "--last-k", "1"])  # the same --out, other numbers: both files replaced
    assert (tmp / "out.md").read_text() != first and (tmp / "out.md").read_text().startswith(compare.REPORT_MARK)
    assert sorted(p.name for p in tmp.iterdir()) == ["cache", "out.md", "out.png", "runs"]  # no temporary left


@pytest.mark.parametrize("appears", ["report", "png", "link"])
def test_a_file_of_yours_that_appears_while_comparing_is_kept(setup, appears, capsys, monkeypatch):
    """Checked again right before each write: a file that appeared after the flags were checked is not replaced."""
    tmp, argv = setup
    out, png = tmp / "out.md", tmp / "out.png"
    compare.main([*argv, "--out", str(tmp / "earlier" / "out.md")])
    capsys.readouterr()
    real = compare.compare_task

    def and_a_file_appears(*args):
        if appears == "report":
            out.write_text("# my notes\n")
        elif appears == "png":
            png.write_bytes(b"my picture")
        else:  # a link to a report compare.py wrote: still a link of yours
            out.symlink_to(tmp / "earlier" / "out.md")
        return real(*args)

    monkeypatch.setattr(compare, "compare_task", and_a_file_appears)
    before = files_under(tmp / "earlier")
    line = refused(capsys, argv)
    target = png if appears == "png" else out
    assert line.startswith(f"error: --out {out}: {target} exists and is "), line
    assert (os.readlink(out) == str(tmp / "earlier" / "out.md") if appears == "link" else
            target.read_bytes() == (b"my picture" if appears == "png" else b"# my notes\n"))
    assert files_under(tmp / "earlier") == before
    assert not list(tmp.glob(".lmhp-tmp*"))


def test_an_out_path_that_is_not_utf8_is_one_line(setup, capsys):
    tmp, argv = setup
    out = os.fsdecode(bytes(tmp / "report") + b"\xff.md")
    line = refused(capsys, [*argv, "--out", out])
    assert line == (f"error: --out {tmp}/report\\xff.md is not UTF-8 text (the report names its PNG in UTF-8 text); "
                    "pass a path whose name is UTF-8")
    assert sorted(p.name for p in tmp.iterdir()) == ["cache", "runs"]


def test_new_or_ours_without_hard_links(tmp_path, monkeypatch):
    """outputs.new_or_ours on a file system that has no hard links (EPERM): the name is claimed exclusively instead."""
    import errno

    from lm_human_preference_details.utils import outputs

    def no_links(src, dst):
        raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))

    monkeypatch.setattr(outputs.os, "link", no_links)
    mine, ours = tmp_path / "mine.md", tmp_path / "ours.md"
    mine.write_text("my notes\n")
    for target in (mine, ours):
        with pytest.raises(FileExistsError) if target == mine else contextlib.nullcontext():
            with outputs.new_or_ours(target, ours=lambda path: path == ours) as tmp:
                tmp.write_text("report\n")
    assert mine.read_text() == "my notes\n" and ours.read_text() == "report\n"
    with outputs.new_or_ours(ours, ours=lambda path: path == ours) as tmp:  # ours: replaced
        tmp.write_text("report 2\n")
    assert ours.read_text() == "report 2\n" and sorted(p.name for p in tmp_path.iterdir()) == ["mine.md", "ours.md"]
