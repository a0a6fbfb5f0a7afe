"""plots.py: a policy run's curves.png (its panels, the KL target, the PNG itself, written atomically)."""

import json
import math
from pathlib import Path

import matplotlib.image
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from lm_human_preference_details.run import plots

SCORE, KL, KL_COEF, ENTROPY = (f"ppo/objective/{k}" for k in ("score", "kl", "kl_coef", "entropy"))


def write_run(run_dir: Path, rows: list[dict], rewards: dict | None) -> Path:
    """A policy run directory as train_policy.py leaves it: metrics.jsonl (non-finite values as strings), config.json."""
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if rewards is not None:
        (run_dir / "config.json").write_text(json.dumps({"seed": 1, "rewards": rewards}))
    return run_dir


ROWS = [{"step": u, SCORE: 0.5 * u, KL: [0.0, 2.0, 4.0, "nan", 5.5][u], KL_COEF: 0.15 - 0.01 * u, ENTROPY: 40.0 - u,
         "ppo/val/loss": 1.0} for u in range(5)]


def test_write_run_curves_draws_four_panels_with_the_kl_target(tmp_path):
    run = write_run(tmp_path / "policy_offline_seed1", ROWS, {"adaptive_kl": True, "target": 6.0, "kl_coef": 0.15})
    fig = plots.run_curves_figure(run)
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == list(plots.RUN_PANELS.values())
    assert list(plots.RUN_PANELS) == [SCORE, KL, KL_COEF, ENTROPY]
    assert all(ax.get_xlabel() == "PPO update" for ax in axes)
    assert axes[0].get_lines()[0].get_xdata().tolist() == [0, 1, 2, 3, 4]
    assert axes[0].get_lines()[0].get_ydata().tolist() == [0, 0.5, 1.0, 1.5, 2.0]
    kl_curve, target = axes[1].get_lines()
    assert kl_curve.get_ydata()[:3].tolist() == [0, 2, 4] and math.isnan(kl_curve.get_ydata()[3])  # logged as "nan"
    assert list(target.get_ydata()) == [6.0, 6.0] and target.get_label() == "target 6"
    png = plots.write_run_curves(run)
    assert png == run / "curves.png" and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    height, width = matplotlib.image.imread(png).shape[:2]
    assert width > 3 * height  # four panels in a row
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "curves.png", "metrics.jsonl"]  # no temporaries


@pytest.mark.parametrize("rewards", [{"adaptive_kl": False, "target": 6.0}, None])
def test_no_target_line_without_the_adaptive_controller(tmp_path, rewards):
    run = write_run(tmp_path / "run", ROWS, rewards)
    assert len(plots.run_curves_figure(run).axes[1].get_lines()) == 1


def test_a_logged_gold_score_gets_its_panel_and_a_rewrite_replaces_the_png(tmp_path):
    run = write_run(tmp_path / "run", [{**r, "ppo/objective/gold_score": 0.1 * r["step"]} for r in ROWS[:2]],
                    {"adaptive_kl": True, "target": 6.0})
    first = plots.write_run_curves(run).read_bytes()
    with open(run / "metrics.jsonl", "a") as f:  # the run goes on: the next checkpoint redraws
        f.write("".join(json.dumps({**r, "ppo/objective/gold_score": 1.0}) + "\n" for r in ROWS[2:]))
    assert [ax.get_title() for ax in plots.run_curves_figure(run).axes][-1] == "gold score (offline labeler)"
    assert plots.write_run_curves(run).read_bytes() != first


def test_a_half_written_last_row_waits_only_while_the_run_writes(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 0, "a": 1.0}\n{"step": 1, "a": "nan"}\n{"step": 2, "a": 3.')
    steps, values = plots.read_curves(path, being_written=True)["a"]  # the saver's thread draws while the run appends
    assert steps.tolist() == [0, 1] and values[0] == 1.0 and math.isnan(values[1])
    with pytest.raises(plots.BadMetricsRow) as e:  # a finished file (compare.py's reading): the line is named
        plots.read_curves(path)
    assert e.value.line == 3
    path.write_text('{"step": 0, "a": 1.0}\n{"a": 2.0}\n{"step": 2, "a": 3.0}\n')
    with pytest.raises(plots.BadMetricsRow) as e:  # only the last line may be half-written
        plots.read_curves(path, being_written=True)
    assert e.value.line == 2


@pytest.mark.parametrize("panels", [4, 5])
def test_the_set_margins_keep_every_label_inside_the_figure_and_off_the_next_panel(tmp_path, panels):
    """The margins are set, not measured (tight_layout's pass cost a third of each drawing): with a kl_coef that moves
    in its sixth decimal (the widest tick labels a run draws, written out, not as an offset over the title), each panel's
    labels and title lie inside the figure and clear of the panel beside it."""
    gold = {"ppo/objective/gold_score": -123.25} if panels == 5 else {}
    rows = [{**r, KL_COEF: 0.15 - 1e-6 * r["step"], SCORE: -1e4 + r["step"], **gold} for r in ROWS]
    fig = plots.run_curves_figure(write_run(tmp_path / "policy_offline_seed1", rows, {"adaptive_kl": True, "target": 6.0}))
    renderer = FigureCanvasAgg(fig).get_renderer()  # as savefig draws a PNG
    fig.draw(renderer)
    inside = fig.bbox
    boxes = [ax.get_tightbbox(renderer) for ax in fig.axes]
    assert len(boxes) == panels and not any(ax.yaxis.get_offset_text().get_text() for ax in fig.axes)
    for box in boxes:
        assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1
    for left, right in zip(fig.axes, boxes[1:]):
        assert left.get_window_extent(renderer).x1 < right.x0  # the next panel's tick labels start after this frame
