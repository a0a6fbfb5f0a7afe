"""One small tracker: the run's config.json, TensorBoard and a metrics.jsonl always, Weights & Biases with --track."""

from __future__ import annotations

import json
import math
from pathlib import Path

from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import atomic_path


class Tracker:
    """Log scalars under the original's metric names with step = update (or batch) index."""

    def __init__(self, run_dir: str | Path, config: dict, *, track: bool, project: str, entity: str | None, name: str,
                 resume_step: int | None = None, wandb_id: str | None = None, enabled: bool = True):
        """``resume_step``: a resumed run, whose logs from this step on are dropped; ``wandb_id``: its W&B run;
        ``enabled``: False on every process but the main one, where nothing is written."""
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
        self.wandb = None
        if track:
            import wandb  # seconds to import, and only with --track

            self.wandb = wandb.init(project=project, entity=entity, name=name, config=config, dir=str(self.run_dir),
                                    id=wandb_id, resume="allow" if wandb_id else None)

    def flush(self) -> None:
        """Put every logged event on disk (before a checkpoint: a kill must not lose steps it will not redo)."""
        if not self.enabled:
            return
        self.writer.flush()
        self.jsonl.flush()

    def state_dict(self) -> dict:
        """What a resumed run needs to continue the same W&B run."""
        return {"wandb_id": self.wandb.id if self.enabled and self.wandb is not None else None}

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
            self.wandb.log(metrics, step=step)

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        """A small table of samples: TensorBoard text always, a W&B table with --track."""
        if not self.enabled:
            return
        header = "| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n"
        body = "".join("| " + " | ".join(str(c).replace("|", "/").replace("\n", " ") for c in r) + " |\n" for r in rows)
        self.writer.add_text(name, header + body, step)
        if self.wandb is not None:
            import wandb  # seconds to import, and only with --track

            self.wandb.log({name: wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        """Flush everything."""
        if not self.enabled:
            return
        self.writer.close()
        self.jsonl.close()
        if self.wandb is not None:
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
