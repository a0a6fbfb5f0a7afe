"""One small tracker: the run's config.json, TensorBoard and a metrics.jsonl always, Weights & Biases with --track.

In W&B a run is laid out as the public baseline's (the fork's train_policy.train): one W&B run per seed named
EXP__SEED__TIME, whose config holds ``exp_name`` and ``task_id`` (what openrlbenchmark selects by), grouped by
experiment and task. A policy run that trains its reward model first is one W&B run: the reward model's
``train_reward/...`` rows at its batch index, then PPO's ``ppo/...`` rows at that phase's batch count + update, as the
baseline's ``_step`` counts them (docs/runs.md). TensorBoard and metrics.jsonl keep each phase's own step.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import atomic_path


@dataclass(frozen=True)
class WandbLayout:
    """Where a run's rows go in W&B: its experiment (config exp_name, the run's name's head), task (config task_id) and
    seed, and whether it is the first phase of a combined run (the reward model a policy run trains first), whose W&B
    run the next phase of this process continues."""

    exp_name: str
    task_id: str
    seed: int
    kind: str  # reward or policy
    first_phase: bool = False

    @property
    def job_type(self) -> str:
        return "reward_then_policy" if self.first_phase else self.kind

    def init_kwargs(self, config: dict) -> dict:
        """wandb.init's name, group, job type and config (this run's, under train_reward for a combined run's first
        phase: the policy's own config joins it when PPO starts)."""
        keys = {"exp_name": self.exp_name, "task_id": self.task_id}
        config = {**keys, "train_reward": config} if self.first_phase else {**keys, **config}
        return {"name": f"{self.exp_name}__{self.seed}__{int(time.time())}", "group": f"{self.exp_name}__{self.task_id}",
                "job_type": self.job_type, "config": config}


class _Handover:
    """The W&B run a combined run's first phase left open in this process, and the W&B step its next phase starts at."""

    run: Any = None
    step: int = 0
    layout: Optional[WandbLayout] = None

    @classmethod
    def take(cls, layout: Optional[WandbLayout]) -> tuple[Any, int]:
        """-> the open W&B run and its next step, for a policy run of the same experiment and task (its seed may differ:
        --rewards.train-new-model.seed); else None."""
        handed = cls.layout
        if cls.run is None or layout is None or handed is None or layout.kind != "policy" or \
                (layout.exp_name, layout.task_id) != (handed.exp_name, handed.task_id):
            return None, 0
        run, cls.run, cls.layout = cls.run, None, None
        return run, cls.step


class Tracker:
    """Log scalars under the original's metric names with step = update (or batch) index."""

    def __init__(self, run_dir: str | Path, config: dict, *, track: bool, project: str, entity: str | None,
                 name: str | None = None, resume_step: int | None = None, wandb_id: str | None = None, enabled: bool = True,
                 layout: Optional[WandbLayout] = None, wandb_step: int = 0):
        """``resume_step``: a resumed run, whose logs from this step on are dropped; ``wandb_id``: its W&B run and
        ``wandb_step`` the W&B step of its step 0 (a checkpoint's); ``enabled``: False on every process but the main
        one, where nothing is written; ``layout``: the W&B run's name, config keys and phase (without it: ``name``)."""
        self.enabled = enabled
        if not enabled:
            return
        from torch.utils.tensorboard import SummaryWriter  # a second or more to import: process 0 alone writes

        self.run_dir = Path(run_dir)
        metrics = self.run_dir / "metrics.jsonl"
        if resume_step is not None and metrics.exists():  # first: a damaged file stops the resume before any write
            keep_rows_before(metrics, resume_step)
        text = json.dumps(config, indent=2, default=str)
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            with atomic_path(self.run_dir / "config.json") as tmp:  # what benchmarks/compare.py reads back
                tmp.write_text(text + "\n")
        except OSError as e:
            raise UserError(f"cannot write the run directory {self.run_dir} ({e.strerror or e}); pass another "
                            "--output-dir") from None
        # purge_step: TensorBoard hides the killed run's events from this step on, so no step shows twice
        self.writer = SummaryWriter(str(self.run_dir), purge_step=resume_step)
        self.writer.add_text("hyperparameters", "```\n" + text + "\n```")
        self.jsonl = open(metrics, "w" if resume_step is None else "a")  # one run per directory (checkpoint.py)
        self.wandb, self.wandb_step, self.layout = None, wandb_step, layout
        handed, step = _Handover.take(layout) if track else (None, 0)
        if handed is not None:  # the next phase of a combined run: the same W&B run, its steps on
            self.wandb, self.wandb_step = handed, step
            self.wandb.config.update(config, allow_val_change=True)
        elif track:
            import wandb  # seconds to import, and only with --track

            layout_kwargs = layout.init_kwargs(config) if layout is not None else {"name": name, "config": config}
            self.wandb = wandb.init(project=project, entity=entity, dir=str(self.run_dir), id=wandb_id,
                                    resume="allow" if wandb_id else None, **layout_kwargs)

    def flush(self) -> None:
        """Put every logged event on disk (before a checkpoint: a kill must not lose steps it will not redo)."""
        if not self.enabled:
            return
        self.writer.flush()
        self.jsonl.flush()

    def state_dict(self) -> dict:
        """What a resumed run needs to continue the same W&B run."""
        if not self.enabled or self.wandb is None:
            return {"wandb_id": None}
        return {"wandb_id": self.wandb.id, "wandb_step": self.wandb_step}

    def log(self, metrics: dict[str, float], step: int) -> None:
        """Write one row of scalars at ``step``."""
        if not self.enabled:
            return
        metrics = {k: float(v) for k, v in metrics.items()}
        for k, v in metrics.items():
            self.writer.add_scalar(k, v, step)
        row = {"step": step, **{k: (v if math.isfinite(v) else str(v)) for k, v in metrics.items()}}
        self.jsonl.write(json.dumps(row) + "\n")
        self.jsonl.flush()
        if self.wandb is not None:
            self.wandb.log(metrics, step=self.wandb_step + step)

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        """A small table of samples: TensorBoard text always, a W&B table with --track."""
        if not self.enabled:
            return
        header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        body = "".join("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in r) + " |\n" for r in rows)
        self.writer.add_text(name, header + body, step)
        if self.wandb is not None:
            import wandb  # seconds to import, and only with --track

            self.wandb.log({name: wandb.Table(columns=columns, data=rows)}, step=self.wandb_step + step)

    def close(self, next_step: Optional[int] = None) -> None:
        """Flush everything. ``next_step``: this phase ended well after that many steps; a combined run's first phase
        then leaves its W&B run open for the next one, which logs its step s at W&B step ``next_step`` + s."""
        if not self.enabled:
            return
        self.writer.close()
        self.jsonl.close()
        if self.wandb is None:
            return
        if next_step is not None and self.layout is not None and self.layout.first_phase:
            _Handover.run, _Handover.step, _Handover.layout = self.wandb, self.wandb_step + next_step, self.layout
        else:
            self.wandb.finish()


def keep_rows_before(path: Path, step: int) -> None:
    """Drop the rows of metrics.jsonl at ``step`` and after (logged by a run killed after its last checkpoint), and a
    last row cut by the kill (it has no newline). Any other line that is not a row (bad JSON, bytes that are not
    UTF-8) is a one-line UserError naming it: the rows before a checkpoint are the run's record, never dropped."""
    *lines, cut = path.read_bytes().split(b"\n")
    rows = []
    for n, line in enumerate(lines, start=1):
        try:
            if json.loads(line.decode("utf-8"))["step"] < step:
                rows.append(line + b"\n")
        except (ValueError, KeyError, TypeError):  # ValueError: bad JSON or bad bytes
            raise UserError(f"cannot resume: {path} line {n} is not a row of metrics ({line[:60]!r}); fix or delete "
                            "that line, then rerun with --resume") from None
    with atomic_path(path) as tmp:
        tmp.write_bytes(b"".join(rows))
