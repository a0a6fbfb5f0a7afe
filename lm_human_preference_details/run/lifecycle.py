"""A run's life: entering its directory (--resume / --overwrite), the tracker, the checkpoints, the agreed stop.

    with Run(args, "policy", inputs=[args.base_model, ...], ranks=ranks) as run:
        ...                                               # build the models and the query stream
        first = run.start(config, objects, identity, models={"policy": policy}, tokenizer=tokenizer)
        for update in run.updates(first, args.n_updates, "ppo", show={...}):
            ...                                           # the algorithm
            run.log(stats, step=update)
            stopping = run.stop_requested(update)         # agreed by every process
            if run.checkpoint_due(update) or stopping:
                run.save_checkpoint(update)
            if stopping:
                run.stop_after(update)                    # raises Stopped

The algorithm is the scripts'; the directory's rules are `directory.RunDirectory`'s (docs/runs.md).
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn, Optional

import torch
from torch import nn

from lm_human_preference_details.language.cards import last_metrics
from lm_human_preference_details.language.model import save_model_dir
from lm_human_preference_details.queries.registry import hub_datasets
from lm_human_preference_details.run.checkpoint import (
    checkpoint_dir,
    restore,
    resume_checkpoint,
    save_errors,
    training_state,
)
from lm_human_preference_details.run.directory import RUN_KINDS, RunDirectory, RunKind
from lm_human_preference_details.run.identity import check_resumed_config
from lm_human_preference_details.run.plots import draw_curves
from lm_human_preference_details.run.saver import BackgroundSaver
from lm_human_preference_details.run.signals import StopSignals, agree_after_update
from lm_human_preference_details.run.tracking import Tracker, WandbLayout
from lm_human_preference_details.utils.errors import Stopped
from lm_human_preference_details.utils.progress import passed, progress, write_above_progress


def card_facts(run_dir: Path, tracker: Tracker | None) -> dict:
    """What a saved model's card tells of its run: the last value of each logged metric, and the W&B run's URL."""
    if tracker is not None:
        tracker.flush()
    wandb_run = getattr(tracker, "wandb", None) if tracker is not None else None
    online = wandb_run is not None and not getattr(wandb_run, "offline", False)  # an offline run has no URL (W&B warns)
    return {"metrics": last_metrics(run_dir / "metrics.jsonl"), "tracked": wandb_run.url if online else None}


class RunSaves:
    """What a started run saves, on process 0 (every process takes part in gathering the state): the checkpoint after an
    update, written in the background (`BackgroundSaver`) with the models' Hugging Face directories RUN/NAME, and a
    finished model. Without ``objects`` there are no checkpoints: only `save_model`."""

    def __init__(self, run_dir: Path, kind: RunKind, ranks, keep: int, config: dict, identity: dict,
                 objects: Mapping[str, Any], models: Mapping[str, nn.Module], tokenizer):
        self.dir, self.kind, self.ranks = run_dir, kind, ranks
        self.config, self.identity, self.objects, self.tokenizer = config, identity, objects, tokenizer
        self.saver = BackgroundSaver(run_dir, keep, models=models) if objects else None
        for optimizer in (o for o in objects.values() if isinstance(o, torch.optim.Optimizer)):
            # a save copies the weights in the background while the next rollout reads them: the first step that
            # changes them waits for the copy (torch's own pre-step hook, so the training loop need not know)
            optimizer.register_step_pre_hook(lambda *_: self.wait_copied())

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
        # flushes the tracker (every row logged before this checkpoint is on disk before it is), then reads the card's
        # facts now: the write runs in a thread while the next rows are logged
        card = {**card_facts(self.dir, tracker), "datasets": hub_datasets(self.config)}

        def write_models(copies: Mapping[str, nn.Module]) -> None:
            for name, model in copies.items():
                save_model_dir(self.dir / name, model, self.tokenizer, {**self.config, "update": done}, **card)
            if self.kind.curves:
                draw_curves(self.dir)  # RUN/curves.png up to this checkpoint (and at the end: the last save)

        return self.saver.save(done, state, write_models)

    def save_after(self, done: int, tracker: Tracker, elapsed: float, wait: bool) -> Path | None:
        """The checkpoint after ``done`` updates, written by process 0 in the background (the next rollout runs
        meanwhile; the first optimizer step waits for the copy of the weights), and waited for when ``wait``; a write
        that fails is every process's failure. A run without checkpoints saves nothing (-> None)."""
        if self.saver is None:
            return None
        with self.ranks.agree():  # process 0 alone writes: its failure is every process's
            path = self.save(done, tracker, elapsed)
            if wait:
                self.saver.wait()
        return path

    def save_model(self, name: str, model: nn.Module, hparams: dict, failure: Exception | None = None,
                   tracker: Tracker | None = None) -> Path:
        """Write the finished model as RUN/NAME (Hugging Face directory, head, hparams) on process 0, atomically;
        every process waits until it is there. ``failure``: a tracker write that failed since the last update (process
        0's): every process stops here instead, and nothing is written."""
        path = self.dir / name
        with self.ranks.agree():  # every process waits until it is there, and stops if it could not be written
            if failure is not None:
                raise failure
            if self.ranks.is_main:
                with save_errors(self.dir, path):
                    save_model_dir(path, model, self.tokenizer, hparams, **card_facts(self.dir, tracker),
                                   datasets=hub_datasets(hparams))
        return path


class Run:
    """One run's life: entered before anything is written, left when the run ends (module docstring)."""

    def __init__(self, args, kind: str, *, inputs: Iterable[Optional[str]], ranks):
        self.args, self.kind, self.ranks, self.dir = args, RUN_KINDS[kind], ranks, Path(args.output_dir)
        self.tracker: Optional[Tracker] = None  # and the saves (RunSaves), once started
        self.saves: Optional[RunSaves] = None
        self.resume_from, self.finished = None, False  # where --resume continues from; a finished run's model is kept
        self._failure, self.show = None, {}  # process 0's tracker error, shared after the update; the bar's metrics
        self.directory = RunDirectory(args.output_dir, kind, resume=args.resume, overwrite=args.overwrite,
                                      inputs=list(inputs), say=self.print)
        self._started, self._start_time, self._loop, self._stopping, self.saved = False, time.time(), None, False, None

    is_main = property(lambda self: self.ranks.is_main)

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
        except BaseException:
            self.__exit__(*sys.exc_info())  # what process 0 made for this run goes (docs/runs.md)
            raise
        self.finished = self.directory.finished
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            if self._loop is not None:  # a failure inside the loop: its signal handlers go now, on this thread
                self._loop.close()
            if self.saves is not None:
                self.saves.close(failed=exc_type is not None)
            if self.tracker is not None:  # a phase that ended well hands its W&B run on, after its loop's steps
                self.tracker.close(next_step=None if exc_type else getattr(self, "total", None))
            if exc_type is not None and not self._started and self.is_main and not self.finished:
                self.directory.remove_if_empty()
        finally:
            self.directory.lock.release()

    # -------------------------------------------------------------------------- start: tracker, resume, saver
    def start(self, config: dict, objects: Mapping[str, Any] | None = None, identity: dict | None = None,
              models: Mapping[str, nn.Module] | None = None, tokenizer=None) -> int:
        """Start logging; on --resume, load the last checkpoint into ``objects`` (what a checkpoint saves; ``identity``:
        what a resumed run must match; ``models``: also saved as RUN/NAME at each save); -> the first update to run."""
        with self.ranks.agree():  # the tracker (process 0 alone) or a checkpoint may fail: every process stops then
            return self._start(config, objects, identity, models, tokenizer)

    def _start(self, config: dict, objects: Mapping[str, Any] | None, identity: dict | None,
               models: Mapping[str, nn.Module] | None, tokenizer) -> int:
        """`start`'s work, on every process (no collective inside)."""
        objects, identity = dict(objects or {}), identity or config
        checkpoint = resume_checkpoint(self.resume_from, identity, quiet=not self.is_main)
        args = self.args
        layout = WandbLayout(args.exp_name, args.task_name, args.seed, self.kind.name, args.first_phase)
        self.tracker = Tracker(self.dir, config, track=args.track, project=args.wandb_project, entity=args.wandb_entity,
                               resume_step=checkpoint["update"] if args.resume else None, enabled=self.is_main,
                               layout=layout, **checkpoint["tracker"])  # its W&B run and step (Tracker.state_dict)
        self._started = True  # config.json is written: from here a failure leaves the run to --resume (docs/runs.md)
        if checkpoint.get("changed") and self.is_main:
            self.print(f"resumed with the online labeller's options changed: {', '.join(checkpoint['changed'])}")
        first = restore(checkpoint, objects) if self.resume_from else 0
        self._start_time = time.time() - checkpoint["elapsed"]
        self.saves = RunSaves(self.dir, self.kind, self.ranks, args.keep_checkpoints, config, identity, objects,
                              dict(models or {}), tokenizer)
        return first

    def check_options(self, config: dict) -> None:
        """On --resume, ``config`` against the run's config.json before anything is trained or written."""
        if self.resume_from is not None:
            check_resumed_config(self.dir / "config.json", config)

    @property
    def elapsed(self) -> float:
        """Seconds of training, the interrupted runs' before a resume included."""
        return time.time() - self._start_time

    # -------------------------------------------------------------------------- the loop
    def updates(self, first: int, total: int, desc: str, show: Mapping[str, str] | None = None) -> Iterator[int]:
        """The indices first..total-1 with a progress bar of the logged metrics ``show`` (label -> name); meanwhile
        SIGTERM, SIGINT and SIGUSR1 only mark a stop that `stop_requested` reads."""
        self.show, self.total, self.desc = dict(show or {}), total, desc
        self.save_interval = getattr(self.args, "save_interval", 0) or total
        self._loop = self._updates(first, total, desc)
        return self._loop

    def _updates(self, first: int, total: int, desc: str) -> Iterator[int]:  # updates(), as a generator
        self.progress = progress(range(first, total), desc=desc, dynamic_ncols=True, initial=first, total=total,
                                 disable=not self.is_main)
        with StopSignals() as self.stop:  # the loop's stop: a wait inside an update may ask it (`stop.signum`)
            yield from self.progress
        self.progress.close()

    def stop_requested(self, update: int) -> bool:
        """After ``update``, every process learns whether a stop signal reached any of them, and whether process 0's
        tracker or checkpoint writer failed (then all raise that failure now); one all-reduce."""
        passed(f"update {update}")  # an audit event: a test may kill or stop the run exactly here
        self._stopping = agree_after_update(self.ranks, self.stop, self._failure or self.saves.error)
        return self._stopping

    def checkpoint_due(self, update: int) -> bool:
        """Whether a checkpoint follows ``update``: every --save-interval updates and after the last one."""
        return self.saves.saver is not None and ((update + 1) % self.save_interval == 0 or update + 1 == self.total)

    def save_checkpoint(self, update: int) -> None:
        """The checkpoint after ``update`` (`RunSaves.save_after`); before a stop and after the last update, waited for."""
        done = update + 1
        self.saved = self.saves.save_after(done, self.tracker, self.elapsed, wait=self._stopping or done == self.total)

    def stop_after(self, update: int) -> NoReturn:
        """End the run after ``update`` on the agreed stop: every process raises `Stopped` (128 + the signal)."""
        self.stop.leaving, signum = True, self.stop.signum or signal.SIGTERM
        self._loop.close()  # leaves the loop's signal handlers (ignored from here under torchrun)
        by = f"stopped by {signal.Signals(signum).name}"
        raise Stopped(f"{by} after update {update}; saved {self.saved}; continue with --resume" if self.saves.saver
                      else f"{by} during {self.desc} training (batch {update}); --resume trains it again", signum)

    def save_model(self, name: str, model: nn.Module, hparams: dict) -> Path:
        """Write the finished model as RUN/NAME on process 0 (`RunSaves.save_model`); every process waits for it. A
        tracker write that failed after the loop (held-out results, normalisation) ends every process here instead."""
        return self.saves.save_model(name, model, hparams, failure=self._failure, tracker=self.tracker)

    def log(self, stats: Mapping[str, float], step: int) -> None:
        """Log a row of metrics at ``step`` and show the chosen ones on the progress bar; a write that fails (process
        0's) ends the run after this update, on every process."""
        self._keep_failure(self.tracker.log, dict(stats), step=step)
        shown = {label: f"{stats[name]:.4g}" for label, name in self.show.items() if name in stats}
        if shown and getattr(self, "progress", None) is not None:
            self.progress.set_postfix(shown, refresh=False)

    def log_table(self, name: str, columns: list[str], rows: list[list], step: int) -> None:
        self._keep_failure(self.tracker.log_table, name, columns, rows, step=step)  # as `log`, process 0's samples

    def _keep_failure(self, write: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """Call ``write``; under torchrun its first error is kept for the next agreement (the others are already on their
        way to their collectives), in a single process raised at once."""
        if self.ranks.world_size == 1:
            write(*args, **kwargs)
            return
        try:
            write(*args, **kwargs)
        except Exception as e:
            self._failure = self._failure or e
