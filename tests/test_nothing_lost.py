"""Issue #30, "nothing lost, round two": links, a literal `~`, `sample`'s run directory, disk full, damaged metrics,
checkpoint checksums, compare.py's unreadable input and label files. The data-loss cases assert every user file's
bytes unchanged; the others assert the exit status, one `error:` line, no traceback, and what is left on disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lm_human_preference_details.cli import UserError
from lm_human_preference_details.labels import OAI_PAD, load_best_of_n_labels

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}


def python(*argv, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``python ARGV`` from the repository root (or ``cwd``), offline."""
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd or ROOT, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=600)


def one_error_line(proc: subprocess.CompletedProcess, match: str, status: int = 2) -> str:
    """The process ended with ``status``, exactly one `error:` line containing ``match``, and no traceback."""
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
    assert proc.returncode == status and len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert match in errors[0], errors[0]
    return errors[0]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (links not followed) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


# ------------------------------------------------------------------------------------------------ label files
def test_a_json_true_in_a_label_file_is_no_token(tmp_path):
    record = {"query": [1, True, OAI_PAD], **{f"sample{i}": [10 + i, OAI_PAD] for i in range(4)}, "best": 0}
    path = tmp_path / "labels.json"
    path.write_text(json.dumps([record]))
    with pytest.raises(UserError, match=r"record 0: field 'query' holds a token outside .* not an integer"):
        load_best_of_n_labels(path, n=4, query_length=3, response_length=2, pad_id=50257)


# ------------------------------------------------------------------------------------------------ compare.py
def write_metrics_run(run_dir: Path, last_row: bytes) -> None:
    """A policy run directory whose metrics.jsonl ends with ``last_row``."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"task_name": "sentiment"}))
    rows = b"".join(json.dumps({"step": s, "ppo/objective/score": 1.0}).encode() + b"\n" for s in range(3))
    (run_dir / "metrics.jsonl").write_bytes(rows + last_row + b"\n")


@pytest.mark.parametrize("last_row", [b'{"step": Infinity, "ppo/objective/score": 1.0}',
                                      b'{"step": 1e400, "ppo/objective/score": 1.0}',
                                      b'{"step": 3, "ppo/objective/score": 1.0, "note": "\xff"}'],
                         ids=["Infinity", "1e400", "not-utf8"])
def test_compare_gives_unreadable_metrics_exit_2_in_one_line(tmp_path, last_row):
    write_metrics_run(tmp_path / "runs" / "policy_sentiment_seed1", last_row)
    proc = python(ROOT / "benchmarks" / "compare.py", "--task", "sentiment", "--ours",
                  tmp_path / "runs" / "policy_{task}_seed*", "--out", tmp_path / "out.md", "--check", "score")
    one_error_line(proc, "metrics.jsonl:4: not a row of scalars with a step")
    assert not (tmp_path / "out.md").exists()
