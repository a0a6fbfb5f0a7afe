"""benchmarks/full_size.py's arithmetic: seconds per update from a run's clock, each save's cost, run against run.

The benchmark itself needs a GPU to mean anything (its numbers are in docs/speed.md); its --small mode runs the same
steps anywhere, but minutes of CPU would buy the suite nothing that tests/run/test_checkpoint.py does not already check.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import full_size  # noqa: E402


def rows(times: list[float], **extra) -> list[dict]:
    return [{"step": i, "ppo/elapsed/time": t, **{k: v[i] for k, v in extra.items()}} for i, t in enumerate(times)]


def test_update_seconds_are_the_differences_of_the_run_clock():
    secs = full_size.update_seconds(rows([0.9, 1.6, 2.4, 3.0]))
    assert secs == pytest.approx({1: 0.7, 2: 0.8, 3: 0.6})  # update 0 has no predecessor


def test_each_save_costs_its_intervals_time_over_the_median_update():
    # saves follow updates 1 and 3 (save interval 2): the intervals after them are updates 2-3 and 4-5
    secs = {1: 1.0, 2: 1.5, 3: 1.0, 4: 1.2, 5: 1.1, 6: 1.0}
    median, costs = full_size.save_costs(secs, save_interval=2)
    assert median == pytest.approx(1.05)
    assert costs == pytest.approx([2.5 - 2.1, 2.3 - 2.1])  # update 6's interval is incomplete: no third cost


def test_largest_differences_compare_common_updates_and_skip_the_clock():
    a = rows([1.0, 2.0], score=[0.5, 0.7], kl=[1.0, 2.0])
    b = rows([5.0, 9.0, 13.0], score=[0.5, 0.4, 9.0], kl=[1.5, 2.0, 9.0])
    assert full_size.largest_differences(a, b) == [("kl", pytest.approx(0.5)), ("score", pytest.approx(0.3))]


def test_the_runs_are_the_sentiment_preset_with_the_built_assets(tmp_path):
    paths = {"model": tmp_path / "m", "labels": tmp_path / "l.json", "queries": tmp_path / "q.parquet"}
    args = full_size.build_parser().parse_args(["--out", str(tmp_path), "--save-interval", "5"])
    argv = full_size.policy_argv(paths, tmp_path / "A", 25, args)
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--task"] == "sentiment" and flags["--ppo.batch-size"] == "512"
    assert flags["--ppo.total-episodes"] == str(512 * 25) and flags["--save-interval"] == "5"
    assert flags["--base-model"] == str(paths["model"]) and flags["--task.query-dataset"] == str(paths["queries"])
    assert flags["--rewards.train-new-model.labels.source"] == str(paths["labels"])
    assert "--num-ranks" not in flags  # the preset's 8 emulated ranks


@pytest.mark.parametrize("flag", ["--updates", "--save-interval", "--kill-after", "--exact-updates", "--rows", "--labels"])
def test_a_size_below_1_is_one_line_before_anything_is_written(flag, tmp_path, capsys):
    least = 0 if flag == "--exact-updates" else 1  # --exact-updates 0: no run C
    with pytest.raises(SystemExit) as e:
        full_size.main(["--out", str(tmp_path / "out"), flag, str(least - 1)])
    assert e.value.code == f"error: {flag} must be at least {least}, got {least - 1}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["A", "report.md", "B.log"])
def test_an_out_that_holds_a_run_or_a_report_is_refused_untouched(name, tmp_path):
    out = tmp_path / "out"
    (out / name).parent.mkdir(parents=True)
    (out / name).write_text("mine")
    with pytest.raises(SystemExit) as e:
        full_size.main(["--out", str(out)])
    assert str(e.value.code).startswith(f"error: {out} already holds runs or a report")
    assert sorted(p.name for p in out.iterdir()) == [name] and (out / name).read_text() == "mine"
