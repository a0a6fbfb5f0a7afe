"""A run directory's rules and lock: whose a directory is (our marker), where a run may start, what --overwrite may
delete (entries runs write, links as links, never an input of the run), and the lock a live run holds. The rules, with
their reasons, are docs/runs.md's; tests/test_run.py and tests/test_nothing_lost.py test each. Writes nothing but the
lock; deletes only in `clear_run`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import Iterable, Optional

from lm_human_preference_details.errors import UserError

MARKER, LOCK = ".lmhp-run.json", ".lmhp-run.lock"
KINDS = ("reward", "policy", "sample")  # the two training scripts, and sample.py's output directory
# what runs write at the top of their directory (tracking.py, checkpoint.py, model.py, the offline task's report):
# the only entries --overwrite and a restarted reward run delete; "reward" is a policy run's own reward run
RUN_ENTRIES = ("config.json", "metrics.jsonl", "events.out.tfevents.*", "wandb", "checkpoints", "reward_model",
               "policy", "reward", "summary.json", "curves.png")
SAMPLE_ENTRIES = ("samples.jsonl", "config.json", "metrics.jsonl", "events.out.tfevents.*", "wandb")  # sample.py's
FINISHED = {"reward": "reward_model"}  # a reward run is finished once its model is saved (atomically)


def read_marker(run_dir: Path) -> Optional[dict]:
    """Our marker's content, or None where there is none (or a foreign file of that name)."""
    try:
        marker = json.loads((Path(run_dir) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) and marker.get("kind") in KINDS else None


def _is_run_entry(path: Path, entries: tuple[str, ...] = RUN_ENTRIES) -> bool:
    return any(path.match(pattern) for pattern in entries)


def _within(inner: Path, outer: Path) -> bool:
    return inner == outer or outer in inner.parents


def both_paths(path: str | Path) -> set[Path]:
    """``path`` as written (absolute, links not followed) and where its links lead: a deletion in the first removes
    the entry named, a deletion through a link would remove the second."""
    path = Path(path).expanduser()
    return {Path(os.path.abspath(path)), path.resolve()}


def local_inputs(paths: Iterable[Optional[str]]) -> list[Path]:
    """The inputs that are files or directories here (Hugging Face names, oai:NAME and URLs are not), each both as
    written and with its links resolved (`both_paths`)."""
    return [p for path in paths if path and Path(path).expanduser().exists() for p in sorted(both_paths(path))]


def check_run_dir(output_dir: str, kind: str, *, resume: bool, overwrite: bool, inputs: Iterable[Optional[str]] = ()) -> str:
    """Every rule a run directory must pass before anything is written (module docstring, rules 1-3); writes nothing.

    -> "fresh" (a new or empty directory), "resume" or "overwrite".
    """
    if not output_dir or not output_dir.strip():
        raise UserError("--output-dir is empty; pass a directory for the run (default: runs/<kind>_<task>_seed<seed>)")
    if resume and overwrite:
        raise UserError("--resume and --overwrite contradict each other; pass one of them")
    run_dir = Path(output_dir)  # expanded once by the flags' finalize (cli.expand_home)
    if not run_dir.exists() or (run_dir.is_dir() and not any(run_dir.iterdir())):
        return "fresh"
    if not run_dir.is_dir():
        raise UserError(f"--output-dir {output_dir} is a file; pass a directory (it is made if missing)")
    marker = read_marker(run_dir)
    if marker is None:
        example = sorted(p.name for p in run_dir.iterdir())[0]
        raise UserError(f"--output-dir {output_dir} holds files that are not a run of this project (e.g. {example!r}); "
                        "a run is never started over them: pass a new or empty directory")
    if marker["kind"] != kind:
        raise UserError(f"--output-dir {output_dir} holds a {marker['kind']} run, and this is a {kind} run: "
                        f"pass another --output-dir")
    if not (resume or overwrite):
        again = ("--overwrite to replace it, or another --output-dir" if kind == "sample" else  # sampling has no resume
                 "--resume to continue it, or --overwrite to delete it and start again")
        raise UserError(f"{output_dir} already holds a {kind} run; pass {again}")
    if overwrite:
        here = both_paths(run_dir)
        for path in local_inputs(inputs):  # the input and the run directory, each as written and through its links
            if any(_within(path, run) for run in here):
                raise UserError(f"--overwrite would delete {path}, an input of this run, which lies in {output_dir}; "
                                "pass another --output-dir")
        if any(_within(Path.cwd().resolve(), run) for run in here):
            raise UserError(f"--overwrite would delete the run in {output_dir}, which holds the current directory; "
                            "pass another --output-dir")
    return "resume" if resume else "overwrite"


def clear_run(run_dir: Path, entries: tuple[str, ...] = RUN_ENTRIES) -> None:
    """Delete the entries a run wrote in ``run_dir`` (``entries``: `RUN_ENTRIES`, or sample.py's `SAMPLE_ENTRIES`; a
    sub-run's only if it has our marker); the marker, the lock and every other file stay. A link is removed as a link,
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
    """An exclusive lock on RUN/.lmhp-run.lock while the run lives; the kernel releases it when the process ends."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK
        self.fd: Optional[int] = None

    def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 200).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise UserError(f"{self.path.parent} is in use by a live run ({holder}); wait for it to end, or pass "
                            "another --output-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on {os.uname().nodename}".encode())
        self.fd = fd

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing drops the lock
            self.fd = None
