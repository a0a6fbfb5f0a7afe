"""benchmarks/offline.py on CI-sized settings: its table holds what the runs measured, its summary what the rows say."""

import json
import os
import statistics
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SEEDS = [1, 2]


def parse(markdown: str) -> dict[str, list[str]]:
    """First column -> the other cells, for every row of the markdown table."""
    rows = [line.strip("|").split("|") for line in markdown.splitlines() if line.startswith("| ")]
    return {cells[0].strip(): [c.strip() for c in cells[1:]] for cells in rows}


def test_offline_benchmark_table(tmp_path, offline_cache):
    out, runs = tmp_path / "offline.md", tmp_path / "runs"
    env = {**os.environ, "LMHP_CACHE": str(offline_cache), "WANDB_MODE": "disabled"}
    command = [sys.executable, str(ROOT / "benchmarks" / "offline.py"), "--seeds", *map(str, SEEDS), "--out", str(out),
               "--runs-dir", str(runs), "--", "--ppo.total-episodes", "128",  # 2 PPO updates per seed
               "--rewards.train-new-model.labels.num-train", "128"]  # 16 reward-model batches: the table is the point
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    text = out.read_text()
    assert text in result.stdout
    assert "-- --ppo.total-episodes 128 --rewards.train-new-model.labels.num-train 128" in text
    assert f"torch {version('torch')}" in text
    table = parse(text)
    titles = table["seed"]
    summaries = {s: json.loads((runs / f"seed{s}" / "summary.json").read_text()) for s in SEEDS}
    assert summaries[1]["reward_model/heldout_accuracy"] != summaries[2]["reward_model/heldout_accuracy"]
    # each seed's row holds its run's summary.json, to 3 decimals (the wall time is the harness's own clock)
    for s in SEEDS:
        row = dict(zip(titles, map(float, table[str(s)])))
        assert row["RM held-out acc. (gold)"] == round(summaries[s]["reward_model/heldout_accuracy"], 3)
        assert row["gain (initial stds)"] == round(summaries[s]["gold_gain_in_initial_stds"], 3)
        assert row["final KL"] == round(summaries[s]["trained/kl"], 3)
        assert row["wall time (s)"] > 0
    # the summary rows: mean and min..max of the seed rows
    for i, title in enumerate(titles):
        values = [float(table[str(s)][i]) for s in SEEDS]
        assert abs(float(table["mean"][i]) - statistics.mean(values)) <= 0.0015, title
        low, high = map(float, table["min..max"][i].split(".."))
        assert (low, high) == (min(values), max(values)), title
    # the verdict lines follow the rows: counted here from the summaries, against docs/offline.md's targets
    meets = {s: (r["reward_model/heldout_accuracy"] >= 0.65, r["gold_gain_in_initial_stds"] >= 1.0,
                 0.5 * r["kl_target"] <= r["trained/kl"] <= 2 * r["kl_target"]) for s, r in summaries.items()}
    for i, prefix in enumerate(["- RM held-out accuracy >= 0.65", "- gold gain >= 1.0", "- final KL within"]):
        line = next(line for line in text.splitlines() if line.startswith(prefix))
        assert f": {sum(m[i] for m in meets.values())}/{len(SEEDS)} seeds" in line
    every = all(all(m) for m in meets.values())
    assert text.rstrip().endswith("every seed met all three targets: " + ("yes" if every else "no"))
