"""A run's life, in one place: entering its directory (--resume / --overwrite), the tracker, when to save, stopping after
an update on SIGTERM or SIGINT (signals.py). What a checkpoint holds is checkpoint.py's; the algorithm is the scripts'.

    with Run(args, "policy", inputs=[args.base_model, ...], ranks=ranks) as run:
        ...                                               # build the models and the query stream
        first = run.start(config, objects, identity, models={"policy": policy}, tokenizer=tokenizer)
        for update in run.updates(first, args.n_updates, "ppo", show={...}):
            ...                                           # the algorithm
            run.log(stats, step=update)

The run directory's rules, lock and preparation are run_dir.py's (docs/runs.md states them); `RunSaves`
writes what a started run saves.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional

from torch import nn

from lm_human_preference_details.checkpoint import (
    BackgroundSaver,
    check_same_run,
    checkpoint_dir,
    event,
    restore,
    resume_checkpoint,
    save_errors,
    training_state,
)
from lm_human_preference_details.model import save_model_dir
from lm_human_preference_details.plots import draw_curves
from lm_human_preference_details.progress import progress, write_above_progress
from lm_human_preference_details.run_dir import RunDirectory
from lm_human_preference_details.run_kinds import RUN_KINDS, RunKind
from lm_human_preference_details.signals import Stopped, StopSignals, agree_after_update
from lm_human_preference_details.tracking import Tracker


class RunSaves:
    """What a started run saves, on process 0 (every process takes part in gathering the state): the checkpoint after an
    update, written in the background (`BackgroundSaver`) with the models' Hugging Face directories RUN/NAME, and a
    finished model. Without ``objects`` there are no checkpoints: only `save_model`."""

    def __init__(self, run_dir: Path, kind: RunKind, ranks, keep: int, config: dict, identity: dict,
                 objects: Mapping[str, Any], models: Mapping[str, nn.Module], tokenizer):
        self.dir, self.kind, self.ranks = run_dir, kind, ranks
        self.config, self.identity, self.objects, self.tokenizer = config, identity, objects, tokenizer
        self.saver = BackgroundSaver(run_dir, keep, models=models) if objects else None

    @property
    def error(self) -> BaseException | None:
        """A checkpoint write's failure (`BackgroundSaver.error`), kept for the agreement after the update."""
        return self.saver.error if self.saver is not None else None

    def wait_copied(self) -> None:
        """Block until the last save has copied the weights off them (`BackgroundSaver.wait_copied`)."""
        if self.saver is not None:
            self.saver.wait_copied()

    def close(self, failed: bool) -> None:
        """Wait for the write under way; after a failure quietly: the loop's own error is the one to show."""
        if self.saver is not None:
            if not failed:
                self.saver.wait()
            else:  # the write under way completes
                self.saver.wait_quietly()

    def save(self, done: int, tracker: Tracker, elapsed: float) -> Path:
        """Checkpoint after ``done`` updates: a thread copies the state while the next rollout runs, then writes the
        training checkpoint and the models' directories (process 0; every process takes part in gathering)."""
        state = training_state(done, self.objects, config=self.identity, tracker=tracker.state_dict(), elapsed=elapsed)
        if not self.ranks.is_main:
            return checkpoint_dir(self.dir, done)
        tracker.flush()  # every row logged before this checkpoint is on disk before it is

        def write_models(copies: Mapping[str, nn.Module]) -> None:
            for name, model in copies.items():
                save_model_dir(self.dir / name, model, self.tokenizer, {**self.config, "update": done})
            if self.kind.curves:
                draw_curves(self.dir)  # RUN/curves.png up to this checkpoint (and at the end: the last save)

        return self.saver.save(done, state, write_models)

    def save_model(self, name: str, model: nn.Module, hparams: dict, failure: Exception | None = None) -> Path:
        """Write the finished model as RUN/NAME (Hugging Face directory, head, hparams) on process 0, atomically;
        every process waits until it is there. ``failure``: a tracker write that failed since the last update (process
        0's): every process stops here instead, and nothing is written."""
        path = self.dir / name
        with self.ranks.agree():  # every process waits until it is there, and stops if it could not be written
            if failure is not None:
                raise failure
            if self.ranks.is_main:
                with save_errors(self.dir, path):
                    save_model_dir(path, model, self.tokenizer, hparams)
        return path


class Run:
    """One run's life: entered before anything is written, left when the run ends (module docstring)."""

    def __init__(self, args, kind: str, *, inputs: Iterable[Optional[str]], ranks, options: Optional[dict] = None):
        self.args, self.kind, self.ranks, self.options = args, RUN_KINDS[kind], ranks, options  # `check_resume_options`
        self.dir = Path(args.output_dir)
        self.tracker: Optional[Tracker] = None
        self.saves: Optional[RunSaves] = None  # once started
        self.resume_from: Optional[Path] = None
        self.finished = False
        self._failure: Optional[Exception] = None  # process 0's tracker error, shared after the update
        self.show: dict[str, str] = {}
        self.directory = RunDirectory(args.output_dir, kind, resume=args.resume, overwrite=args.overwrite,
                                      inputs=list(inputs), say=self.print)
        self._started = False
        self._start_time = time.time()

    @property
    def is_main(self) -> bool:
        return self.ranks.is_main

    def print(self, *text: str) -> None:
        """Print on process 0 only, above the progress bar."""
        if self.is_main:
            write_above_progress(" ".join(text))

    # -------------------------------------------------------------------------- enter: check, lock, prepare
    def __enter__(self) -> Run:
        with self.ranks.main_first():  # process 0 checks, locks and prepares the directory, then the others read it
            if self.is_main:
                self.directory.enter()
        try:
            with self.ranks.agree():  # every process sees the run where process 0 does, or the job ends in one line
                self.resume_from = self.directory.resume_point(self.ranks.from_main)
                check_resume_options(self)  # the options, before anything is trained or written
        except BaseException:
            self.__exit__(*sys.exc_info())  # what process 0 made for this run goes (rule 5)
            raise
        self.finished = self.directory.finished
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self.saves is not None:
                self.saves.close(failed=exc_type is not None)
            if self.tracker is not None:
                self.tracker.close()
            if exc_type is not None and not self._started and self.is_main and not self.finished:
                self.directory.remove_if_empty()
        finally:
            self.directory.lock.release()

    # -------------------------------------------------------------------------- start: tracker, resume, saver
    def start(self, config: dict, objects: Mapping[str, Any] | None = None, identity: dict | None = None,
              models: Mapping[str, nn.Module] | None = None, tokenizer=None) -> int:
        """Start logging; on --resume, load the last checkpoint into ``objects``; -> the first update to run.

        ``objects`` (name -> object with state_dict) are what a checkpoint saves; ``identity`` is what a resumed run
        must match (`check_same_run`); ``models`` are also written as Hugging Face directories RUN/NAME at each save.
        """
        with self.ranks.agree():  # the tracker (process 0 alone) or a checkpoint may fail: every process stops then
            return self._start(config, objects, identity, models, tokenizer)

    def _start(self, config: dict, objects: Mapping[str, Any] | None, identity: dict | None,
               models: Mapping[str, nn.Module] | None, tokenizer) -> int:
        """`start`'s work, on every process (no collective inside)."""
        objects, identity = dict(objects or {}), identity or config
        checkpoint = resume_checkpoint(self.resume_from, identity, quiet=not self.is_main)
        args = self.args
        self.tracker = Tracker(self.dir, config, track=args.track, project=args.wandb_project, entity=args.wandb_entity,
                               name=f"{self.kind.name}_{args.task_name}_seed{args.seed}_{int(time.time())}",
                               resume_step=checkpoint["update"] if args.resume else None,
                               wandb_id=checkpoint["tracker"].get("wandb_id"), enabled=self.is_main)
        self._started = True  # config.json is written: from here a failure leaves the run to --resume (rule 5)
        first = restore(checkpoint, objects) if self.resume_from else 0
        self._start_time = time.time() - checkpoint["elapsed"]
        self.saves = RunSaves(self.dir, self.kind, self.ranks, args.keep_checkpoints, config, identity, objects,
                              dict(models or {}), tokenizer)
        return first

    def wait_checkpoint_copy(self) -> None:
        """Block until the last save has copied the weights off them (BackgroundSaver.wait_copied): the loop calls it
        before anything changes them, i.e. before its optimizer steps. A no-op without checkpoints."""
        if self.saves is not None:
            self.saves.wait_copied()

    @property
    def elapsed(self) -> float:
        """Seconds of training, the interrupted runs' before a resume included."""
        return time.time() - self._start_time

    # -------------------------------------------------------------------------- the loop
    def updates(self, first: int, total: int, desc: str, show: Mapping[str, str] | None = None) -> Iterator[int]:
        """Yield the update (or batch) indices first..total-1 with a progress bar showing the logged metrics ``show``
        (label -> name). After each one: save every --save-interval, at the end, and on a stop signal; a SIGTERM or
        SIGINT ends the run after the update with one line (a run without checkpoints saves nothing)."""
        self.show = dict(show or {})
        self.progress = progress(range(first, total), desc=desc, dynamic_ncols=True, initial=first, total=total,
                                 disable=not self.is_main)
        save_interval = getattr(self.args, "save_interval", 0) or total
        saver = self.saves.saver  # None: a run without checkpoints
        with StopSignals() as self.stop:  # the loop's stop: a wait inside an update may ask it (`stop.signum`)
            for update in self.progress:
                yield update
                event(f"update {update}")  # tests' hook: off in real runs
                stopping = agree_after_update(self.ranks, self.stop, self._failure or self.saves.error)
                done = update + 1
                saved = None
                if saver is not None and (done % save_interval == 0 or done == total or stopping):
                    with self.ranks.agree():  # process 0 alone writes: its failure is every process's
                        saved = self.saves.save(done, self.tracker, self.elapsed)
                        if stopping or done == total:
                            saver.wait()
                if stopping:
                    self.stop.leaving = True
                    if saver is not None:
                        raise Stopped(f"stopped by {self.stop.name} after update {update}; saved {saved}; continue "
                                      "with --resume", self.stop.signum or signal.SIGTERM)
                    raise Stopped(f"stopped by {self.stop.name} during {desc} training (batch {update}); --resume "
                                  "trains it again", self.stop.signum or signal.SIGTERM)
        self.progress.close()

    def save_model(self, name: str, model: nn.Module, hparams: dict) -> Path:
        """Write the finished model as RUN/NAME on process 0 (`RunSaves.save_model`); every process waits for it. A
        tracker write that failed after the loop (held-out results, normalisation) ends every process here instead."""
        return self.saves.save_model(name, model, hparams, failure=self._failure)

    def log(self, stats: Mapping[str, float], step: int) -> None:
        """Log a row of metrics at ``step`` and show the chosen ones on the progress bar; a write that fails (on
        process 0) ends the run at the end of this update, on every process (`agree_after_update`)."""
        self._keep_failure(self.tracker.log, dict(stats), step=step)
        shown = {label: f"{stats[name]:.4g}" for label, name in self.show.items() if name in stats}
        if shown and getattr(self, "progress", None) is not None:
            self.progress.set_postfix(shown, refresh=False)

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        """Log a table (process 0's samples) at ``step``; a failure is kept as `log`'s is."""
        self._keep_failure(self.tracker.log_table, name, columns, rows, step=step)

    def _keep_failure(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Call ``write``; its first error is kept for the next agreement, after the update or at the final model's
        save (under torchrun the others are already on their way to their collectives), raised at once in a single
        process."""
        if self.ranks.world_size == 1:
            write(*args, **kwargs)
            return
        try:
            write(*args, **kwargs)
        except Exception as e:
            self._failure = self._failure or e


def check_resume_options(run: Run) -> None:
    """On --resume, the run's ``options`` (the config it starts with, where its script gave them) against its
    config.json (its last start's, which passed the checkpoint's check) as the run is entered, before anything is
    trained or written: an option that may not change is refused now, not after a reward model trained or online/ was
    written (`Run.start` checks them against the checkpoint after); the online labeller's options that changed are
    said once."""
    if run.resume_from is None or run.options is None:
        return
    try:
        saved = json.loads((run.dir / "config.json").read_text())
    except (OSError, ValueError):
        return
    if isinstance(saved, dict):
        changed = check_same_run(saved, json.loads(json.dumps(run.options, default=str)))
        if changed:
            run.print(f"resumed with the online labeller's options changed: {', '.join(changed)}")
