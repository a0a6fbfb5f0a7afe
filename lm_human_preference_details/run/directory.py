"""A run directory's rules and lock: whose a directory is (our marker), where a run may start, what --overwrite may
delete (entries runs write, links as links, never an input of the run), and the lock a live run holds. The rules, with
their reasons, are docs/runs.md's; tests/run/test_directory.py and tests/e2e/test_user_files.py test each. `RunDirectory` holds
a run's directory for process 0: checks it, takes the lock, prepares it (leftovers, --overwrite, our marker), and
removes what it made if the run fails before it starts; every process then checks that it sees the run as process 0
does (`resume_point`).
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from filelock import FileLock

from lm_human_preference_details.run.checkpoint import CHECKPOINTS, list_checkpoints
from lm_human_preference_details.run.checksums import CHECKSUMS
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import (
    SHARED_DIR_WAIT_S,
    atomic_path,
    hold_lock,
    lock_holder,
    remove_leftovers,
    sha256_of,
)
from lm_human_preference_details.utils.outputs import RUN_MARKER, check_output_dir

# what runs write at the top of their directory (tracking.py, checkpoint.py, model.py, the offline task's report):
# the only entries --overwrite and a restarted reward run delete; "reward" is a policy run's own reward run
RUN_ENTRIES = ("config.json", "metrics.jsonl", "events.out.tfevents.*", "wandb", "checkpoints", "reward_model",
               "policy", "reward", "summary.json", "curves.png", "online")
SAMPLE_ENTRIES = ("samples.jsonl", "config.json", "metrics.jsonl", "events.out.tfevents.*", "wandb")  # sample.py's
EVALUATE_ENTRIES = ("comparisons.json", "comparisons.json.session.jsonl", "results.json", "win_rates.png", "dataset")


@dataclass(frozen=True)
class RunKind:
    """A kind of run, decided here once and read by every module that asks: the name its directory's marker holds,
    the entries it writes (the only ones --overwrite deletes), the saved model that marks it finished, whether it keeps
    training checkpoints that --resume continues from, whether it can be resumed at all, and whether it draws curves."""

    name: str
    """the marker's "kind", and the default directory's prefix (runs/<name>_<task>_seed<seed>)"""
    entries: tuple[str, ...]
    """the entries it writes at the top of its directory, as patterns"""
    finished: Optional[str] = None
    """the entry whose presence marks the run finished (saved atomically): --resume reuses it, else trains again"""
    checkpoints: bool = False
    """it keeps training checkpoints in RUN/checkpoints, and --resume continues from the last"""
    resumable: bool = True
    """--resume applies (sampling is only ever done again: --overwrite)"""
    curves: bool = False
    """each save also draws RUN/curves.png"""


RUN_KINDS = {kind.name: kind for kind in (
    RunKind("reward", RUN_ENTRIES, finished="reward_model"),  # the two training scripts
    RunKind("policy", RUN_ENTRIES, checkpoints=True, curves=True),
    RunKind("sample", SAMPLE_ENTRIES, resumable=False),  # sample.py's output directory
    RunKind("evaluate", EVALUATE_ENTRIES),  # evaluate.py's: the same command continues it
)}

MARKER, LOCK = RUN_MARKER, ".lmhp-run.lock"


def read_marker(run_dir: Path) -> Optional[dict]:
    """Our marker's content, or None where there is none (or a foreign file of that name)."""
    try:
        marker = json.loads((Path(run_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("kind") in RUN_KINDS else None


def _described(standing: dict) -> str:
    """A run directory's `RunDirectory.standing`, in words."""
    if "unreadable" in standing:
        return f"an unreadable directory ({standing['unreadable']})"
    if standing["run"] is None:
        return "no run"
    where = (f", last checkpoint {standing['checkpoint']} (SHA256SUMS {str(standing['sums'])[:12]})"
             if standing["checkpoint"] else ", no checkpoint")
    return f"run {standing['run']}{where}{', a finished model' if standing['finished'] else ''}"


def _is_run_entry(path: Path, entries: tuple[str, ...] = RUN_ENTRIES) -> bool:
    return any(path.match(pattern) for pattern in entries)


def check_run_dir(output_dir: str, kind: str, *, resume: bool, overwrite: bool, inputs: Iterable[Optional[str]] = ()) -> str:
    """Every rule a run directory must pass before anything is written (module docstring, rules 1-3), as the one gate
    for every output decides (utils/outputs.py); writes nothing.

    -> "fresh" (a new or empty directory), "resume" or "overwrite".
    """
    if not output_dir or not output_dir.strip():
        raise UserError("--output-dir is empty; pass a directory for the run (default: runs/<kind>_<task>_seed<seed>)")
    return check_output_dir(output_dir, kind, flag="--output-dir", overwrite=overwrite, resume=resume,
                            resumable=RUN_KINDS[kind].resumable, inputs=inputs).mode


def clear_run(run_dir: Path, entries: tuple[str, ...] = RUN_ENTRIES) -> None:
    """Delete the entries a run wrote in ``run_dir`` (``entries``: its kind's, `RunKind.entries`; a policy run's own
    reward run's only if it has our marker); the marker, the lock and every other file stay. A link is removed as a link,
    never entered: what it points to stays."""
    for entry in sorted(Path(run_dir).iterdir()):
        if not _is_run_entry(entry, entries):
            continue
        if entry.is_symlink() or not entry.is_dir():
            entry.unlink()
        elif entry.name == "reward":  # a policy run's own reward run: its entries only
            if read_marker(entry) is not None:
                clear_run(entry)
                for own in (MARKER, LOCK):
                    (entry / own).unlink(missing_ok=True)
                if not any(entry.iterdir()):
                    entry.rmdir()
        else:
            shutil.rmtree(entry)  # removes links inside as links (rmtree never follows one)


class DirectoryLock:
    """An exclusive lock on RUN/.lmhp-run.lock while the run lives (`files.hold_lock`); the kernel releases it when the
    process ends."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.held: Optional[FileLock] = None

    def acquire(self) -> None:
        try:
            self.held = hold_lock(self.path)
        except OSError as e:  # no run can hold it either: its empty file goes
            self.path.unlink(missing_ok=True)
            raise UserError(f"cannot lock {self.path} ({e.strerror or e}); pass an --output-dir on a file system with "
                            "locks") from None
        if self.held is None:
            raise UserError(f"{self.path.parent} is in use by a live run ({lock_holder(self.path)}); wait for it to end, "
                            "or pass another --output-dir")

    def release(self) -> None:
        if self.held is not None:
            self.held.release()
            self.held = None


class RunDirectory:
    """Process 0's hold on a run's directory while the run lives: `enter` checks it (rules 1-3), takes the lock and
    prepares it, `resume_point` tells every process what it found; the run releases ``lock`` when it ends, after
    `remove_if_empty` if it failed before it started."""

    def __init__(self, output_dir: str, kind: str, *, resume: bool, overwrite: bool, inputs: list[Optional[str]],
                 say: Callable[[str], None]):
        self.dir, self.kind, self.output_dir = Path(output_dir), RUN_KINDS[kind], output_dir
        self.resume, self.overwrite, self.inputs, self.say = resume, overwrite, inputs, say
        self.lock = DirectoryLock(self.dir)
        self.made_dir = False
        self.finished = False  # --resume found a finished model (RunKind.finished) to reuse

    def enter(self) -> None:
        """Check, lock and prepare the directory; what this run made goes if that fails (docs/runs.md)."""
        mode = check_run_dir(self.output_dir, self.kind.name, resume=self.resume, overwrite=self.overwrite,
                             inputs=self.inputs)
        try:
            self._prepare(mode)
        except BaseException:  # a full disk at the marker: what this run made goes, as in Run.__exit__
            if self.lock.held is not None:  # the lock is ours: so are a bare marker and lock
                self.remove_if_empty()
            elif self.made_dir and not any(self.dir.iterdir()):  # a directory this run made, left empty
                self.dir.rmdir()
            self.lock.release()
            raise

    def _prepare(self, mode: str) -> None:
        """Take the lock, then clean, clear or mark the directory as ``mode`` says."""
        self.made_dir = not self.dir.exists()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.lock.acquire()
        # re-read under the lock: another run may have started here since the check
        if mode == "fresh" and any(p.name != LOCK for p in self.dir.iterdir()):
            mode = check_run_dir(self.output_dir, self.kind.name, resume=self.resume, overwrite=self.overwrite,
                                 inputs=self.inputs)
        remove_leftovers(self.dir)
        remove_leftovers(self.dir / "checkpoints")
        finished = self.kind.finished
        if mode == "resume" and finished and (self.dir / finished).is_dir():
            self.say(f"resume: reusing the finished {self.kind.name} model {self.dir / finished}")
            self.finished = True
            return
        if mode == "overwrite" or (mode == "resume" and finished):  # an unfinished reward run is trained again
            self.say(f"{mode}: deleting the {'run' if mode == 'overwrite' else 'unfinished run'} in {self.dir} and "
                     "starting again")
            clear_run(self.dir, self.kind.entries)
        elif mode == "fresh" and self.resume:
            self.say(f"resume: {self.dir} holds no run yet; starting from the beginning")
        if mode != "resume" or finished:
            text = json.dumps({"kind": self.kind.name, "id": uuid.uuid4().hex[:12],
                               "created": time.strftime("%Y-%m-%dT%H:%M:%S"), "by": "lm-human-preference-details"}, indent=2)
            with atomic_path(self.dir / MARKER) as tmp:  # never a half-written (0-byte) marker
                tmp.write_text(text + "\n")

    def standing(self) -> dict:
        """Where the run in this directory stands, as this process sees it: its marker's id, whether it holds a
        finished model (`RunKind.finished`), and the last checkpoint of a run that keeps them, with the sha256 of its
        SHA256SUMS."""
        finished = self.kind.finished
        try:
            marker = read_marker(self.dir)
            found = list_checkpoints(self.dir) if self.kind.checkpoints else []
            sums = found[-1] / CHECKSUMS if found else None
            return {"run": marker and marker.get("id"), "finished": bool(finished and (self.dir / finished).is_dir()),
                    "checkpoint": found[-1].name if found else None,
                    "sums": sha256_of(sums) if sums is not None and sums.is_file() else None}
        except OSError as e:  # still a view to compare: this process must reach the collective in resume_point
            return {"run": None, "finished": False, "checkpoint": None, "sums": None,
                    "unreadable": f"{type(e).__name__}: {e}"}

    def resume_point(self, from_main: Callable[[dict], dict]) -> Optional[Path]:
        """After `enter`, on every process: where the run stands as process 0 sees it (``from_main``: process 0's
        `standing`, shared with every process), checked against this process's own view; -> the last checkpoint a
        resumed policy run continues from (None: it starts from the beginning), and ``finished``.

        A process that sees another run (node-local disks, or a relative --output-dir taken from each launcher's own
        working directory) ends the job with one line, before anything trains: never a node that resumes alone.
        """
        seen = self.standing()
        stands = from_main(seen)
        deadline = time.monotonic() + SHARED_DIR_WAIT_S
        while seen != stands and time.monotonic() < deadline:  # a shared file system may show process 0's writes late
            time.sleep(0.5)
            seen = self.standing()
        if seen != stands:
            raise UserError(f"--output-dir {self.output_dir} ({os.path.abspath(self.dir)} here) is not the same run "
                            f"directory on every process: here {_described(seen)}, on process 0 {_described(stands)}; "
                            "every node must see one run: pass an absolute --output-dir on a file system all nodes "
                            "share (docs/checkpoints.md, \"Where a run stands\")")
        self.finished = stands["finished"]  # process 0 kept a finished model (an unfinished one it cleared)
        if self.finished or not (self.resume and self.kind.checkpoints):
            return None
        resume_from = self.dir / CHECKPOINTS / stands["checkpoint"] if stands["checkpoint"] else None
        self.say(f"resume: continuing from {resume_from}" if resume_from else
                 f"resume: {self.dir} holds no checkpoint yet; starting from the beginning")
        return resume_from

    def remove_if_empty(self, beside_others: bool = False) -> None:
        """A run that failed before it started leaves nothing of its own behind. ``beside_others``: the caller
        knows every other entry is someone else's (sample.py, before its samples), so our marker and lock go even then,
        and no later --overwrite takes those entries for ours."""
        if not self.dir.is_dir() or (not beside_others and any(p.name not in (MARKER, LOCK) for p in self.dir.iterdir())):
            return
        for own in (MARKER, LOCK):
            (self.dir / own).unlink(missing_ok=True)
        if self.made_dir and not any(self.dir.iterdir()):
            self.dir.rmdir()
