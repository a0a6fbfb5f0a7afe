"""Learning curves as PNG files (matplotlib, Agg): a policy run's own curves.png, and runs drawn over a baseline.

Both read what a run writes: RUN/metrics.jsonl (one row of scalars per PPO update, `step` = the update) and
RUN/config.json. Files are written atomically, so a reader never sees half a PNG.
"""

from __future__ import annotations

import json
import math
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lm_human_preference_details.utils.files import atomic_path

# a policy run's panels: metric -> title; the last is the offline task's labeler, drawn when the run logs it
RUN_PANELS = {"ppo/objective/score": "score (reward model)", "ppo/objective/kl": "KL(policy || initial)",
              "ppo/objective/kl_coef": "kl_coef", "ppo/objective/entropy": "entropy"}
OPTIONAL_PANELS = {"ppo/objective/gold_score": "gold score (offline labeler)"}

PANEL_INCHES = (4.0, 3.4)  # a run's panel, width and height
# a run's margins in inches, set, not measured: left of the first panel (its tick labels), right of the last, between
# two panels (the next one's tick labels), above (the run's name and the titles), below (the x label). Drawn at every
# checkpoint: tight_layout's measuring pass cost a third of a drawing (0.7 -> 0.5 CPU s for 5 panels, 2-core VM)
RUN_MARGINS = (0.8, 0.15, 0.95, 0.62, 0.5)
Curve = tuple[np.ndarray, np.ndarray]  # (steps, values)
SOFTWARE = "lm_human_preference_details"  # the Software text of every PNG we draw: how a later write knows it is ours
PNG_MARK = b"tEXtSoftware\x00" + SOFTWARE.encode()  # that text chunk as it lies in the file
_DRAWING = threading.Lock()


def _figure(rows: int, columns: int, figsize: tuple[float, float]):
    """A matplotlib Figure and its [rows, columns] axes, outside pyplot's global state: the background saver draws
    a run's curves in its own thread while training goes on."""
    from matplotlib.figure import Figure  # seconds to import: only a save and compare.py draw

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(rows, columns, squeeze=False)


class BadMetricsRow(ValueError):
    """A line of metrics.jsonl that is not a row of scalars with a step; ``line`` counts from 1."""

    def __init__(self, line: int):
        super().__init__(f"line {line}: not a row of scalars with a step")
        self.line = line


def as_curves(points: dict[str, dict[int, float]]) -> dict[str, Curve]:
    """metric -> {step: value} as metric -> (steps, values), sorted by step."""
    return {m: (np.array(sorted(p), dtype=int), np.array([p[s] for s in sorted(p)], dtype=float)) for m, p in points.items()}


def read_curves(metrics_jsonl: Path, being_written: bool = False) -> dict[str, Curve]:
    """metric -> (steps, values) of a Tracker's metrics.jsonl (non-finite values are logged as strings, read as floats);
    BadMetricsRow names the first line that is not a row of scalars with a step. ``being_written``: the run is still
    appending, so a half-written last line is left for the next reading."""
    points: dict[str, dict[int, float]] = {}
    lines = Path(metrics_jsonl).read_bytes().splitlines()  # bytes: a line that is not UTF-8 is a bad row, named
    for n, line in enumerate(lines, start=1):
        try:
            row = json.loads(line.decode("utf-8"))
            step = int(row.pop("step"))  # Infinity or 1e400: OverflowError
            for key, value in row.items():
                points.setdefault(key, {})[step] = float(value)
        except (ValueError, KeyError, TypeError, AttributeError, OverflowError):
            if being_written and n == len(lines):
                continue
            raise BadMetricsRow(n) from None
    return as_curves(points)


def kl_target(run_dir: Path) -> float | None:
    """The adaptive KL controller's target from RUN/config.json (rewards.target), None when the KL coefficient is fixed."""
    path = Path(run_dir) / "config.json"
    if not path.is_file():
        return None
    rewards = json.loads(path.read_text()).get("rewards", {})
    return float(rewards["target"]) if rewards.get("adaptive_kl") and rewards.get("target") is not None else None


def run_curves_figure(run_dir: str | Path):
    """The figure of a policy run's curves: one panel per RUN_PANELS metric (and OPTIONAL_PANELS it logs), x = update."""
    run_dir = Path(run_dir)
    curves = read_curves(run_dir / "metrics.jsonl", being_written=True)
    panels = {**RUN_PANELS, **{k: t for k, t in OPTIONAL_PANELS.items() if k in curves}}
    target = kl_target(run_dir)
    width, height = PANEL_INCHES[0] * len(panels), PANEL_INCHES[1]
    fig, axes = _figure(1, len(panels), figsize=(width, height))
    left, right, gap, top, bottom = RUN_MARGINS
    axes_width = (width - left - right - gap * (len(panels) - 1)) / len(panels)
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=gap / axes_width)
    for ax, (key, title) in zip(axes[0], panels.items()):
        steps, values = curves.get(key, (np.array([]), np.array([])))
        ax.plot(steps, values, lw=1.2)
        ax.ticklabel_format(axis="y", useOffset=False)  # 0.149998, not "+1.499e-1" over the panel's title
        if key == "ppo/objective/kl" and target is not None:
            ax.axhline(target, color="k", ls="--", lw=1, label=f"target {target:g}")
            ax.legend(loc="best", fontsize=8)
        ax.set_title(title)
        ax.set_xlabel("PPO update")
        ax.grid(alpha=0.3)
    fig.suptitle(run_dir.name, fontsize=9)
    return fig


def save_figure(fig, path: str | Path, dpi: int = 90) -> Path:
    """Write ``fig`` to ``path`` as a PNG, atomically, marked as ours (`PNG_MARK`), and free it."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format="png", metadata={"Software": SOFTWARE})
    return Path(path)


def is_our_png(path: Path) -> bool:
    """Whether ``path`` is a PNG this project drew: its text chunk names us (matplotlib writes it before the pixels)."""
    with open(path, "rb") as f:
        return PNG_MARK in f.read(4096)


def write_run_curves(run_dir: str | Path) -> Path:
    """RUN/metrics.jsonl -> RUN/curves.png (score, KL with its target, kl_coef, entropy per PPO update); its path.

    Cheap enough for every checkpoint (docs/docker.md has its cost); flush the tracker first, so the rows are on disk.
    """
    with _DRAWING:  # the saver's thread and the offline report may draw the same file
        return save_figure(run_curves_figure(run_dir), Path(run_dir) / "curves.png")


@dataclass
class Panel:
    """One panel of a comparison: our runs' curves (name -> curve) over the baseline's mean and band."""

    title: str
    ours: dict[str, Curve]
    baseline: Curve | None = None
    band: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # (steps, low, high)
    baseline_label: str = "baseline"


def mean_curve(curves: dict[str, Curve]) -> Curve:
    """The mean over runs at the updates every run logged."""
    common = sorted(set.intersection(*(set(s.tolist()) for s, _ in curves.values())))
    steps = np.array(common, dtype=int)
    values = [v[np.searchsorted(s, steps)] for s, v in curves.values()]  # each run's values at those steps
    return steps, np.mean(values, axis=0)


def comparison_figure(panels: list[Panel], columns: int):
    """Panels in rows of ``columns``: each of our runs thin, their mean thick, over the baseline's band and mean."""
    rows = math.ceil(len(panels) / columns)
    fig, axes = _figure(rows, columns, figsize=(4.6 * columns, 3.6 * rows))
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, panel in zip(axes.flat, panels):
        if panel.band is not None:
            steps, low, high = panel.band
            ax.fill_between(steps, low, high, color="tab:gray", alpha=0.3, lw=0, label=f"{panel.baseline_label} band")
        if panel.baseline is not None:
            ax.plot(*panel.baseline, color="k", lw=1.5, ls="--", label=f"{panel.baseline_label} mean")
        for i, curve in enumerate(panel.ours.values()):
            ax.plot(*curve, color="tab:blue", lw=0.7, alpha=0.35, label="ours, each run" if i == 0 else None)
        if panel.ours:
            ax.plot(*mean_curve(panel.ours), color="navy", lw=2.2, zorder=3, label=f"ours, mean of {len(panel.ours)}")
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("PPO update")
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=7)
    fig.tight_layout()
    return fig


def draw_curves(run_dir: Path) -> None:
    """RUN/curves.png (plots.write_run_curves); a picture that cannot be drawn is a warning, never the end of a run."""
    try:
        write_run_curves(run_dir)
    except Exception as e:  # matplotlib's errors are many; the checkpoint beside it is what matters
        print(f"warning: {run_dir / 'curves.png'} not drawn ({type(e).__name__}: {e}); training goes on", file=sys.stderr)
