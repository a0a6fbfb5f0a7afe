"""A labelling session (label.py): its items, the journal of every choice, and the label file it writes.

Two files, side by side:
    OUTPUT                 the labels so far in OpenAI's best_of_4 schema (what --labels.source reads), rewritten
                           atomically (a temporary, fsync, rename) after each choice: never half-written
    OUTPUT.session.jsonl   the journal: line 1 the session (its flags and every item's tokens and texts), then one
                           line per choice (label, skip, undo), appended and fsynced before the page hears "saved"
The journal is the truth: a session killed at any point (kill -9 included) restarts from it, rewrites OUTPUT from it,
and shows the same items. OUTPUT is ours only while our journal sits beside it and OUTPUT holds what that journal
says; anything else at either path is the user's and is never written (docs/runs.md). Every method that changes the
session holds one lock, so two browser tabs never label one item twice.
Journal holds the journal's file (lock, read, append); LabelSession holds the decisions and answers the page.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Optional

from lm_human_preference_details.errors import UserError
from lm_human_preference_details.files import HOST, TMP, atomic_path

VERSION = 1  # of the journal's format
N_SAMPLES = 4  # best_of_4, the type of every label file OpenAI released
LEASE_S = 600.0  # how long an item shown to one tab is kept from the others while that tab says nothing


def journal_path(output: Path) -> Path:
    """The journal beside the label file ``output``."""
    return output.with_name(output.name + ".session.jsonl")


def render(items: list[dict], best: dict[int, int]) -> bytes:
    """The label file of the items labelled so far: OpenAI's records {query, sample0..3, best}, in item order."""
    records = [{"query": items[i]["query"], **{f"sample{j}": s for j, s in enumerate(items[i]["samples"])}, "best": b}
               for i, b in sorted(best.items())]
    return json.dumps(records).encode()


def write_label_file(output: Path, data: bytes) -> None:
    """Rewrite the label file: a temporary, fsynced, renamed into place."""
    with atomic_path(output) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    fsync_dir(output.parent)


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new name in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Decisions:
    """What the events of a journal decided: each item's label or skip, and each tab's undoable choices, in order."""

    def __init__(self) -> None:
        self.best: dict[int, int] = {}  # item -> chosen sample
        self.skipped: set[int] = set()
        self.history: dict[str, list[int]] = {}  # client -> the items it decided, oldest first

    def apply(self, event: dict) -> None:
        """Replay one journal event."""
        item, client = event["item"], event["client"]
        if event["event"] == "undo":
            self.best.pop(item, None)
            self.skipped.discard(item)
            self.history[client].remove(item)
            return
        if event["event"] == "label":
            self.best[item] = event["best"]
        else:
            self.skipped.add(item)
        self.history.setdefault(client, []).append(item)

    def is_open(self, item: int) -> bool:
        return item not in self.best and item not in self.skipped


class Journal:
    """A session's journal file, open and locked (flock) while the session runs: read once, then appended to."""

    def __init__(self, path: Path, handle):
        self.path, self.handle = path, handle

    @classmethod
    def lock(cls, output: Path) -> Journal:
        """The journal beside ``output``, opened and locked; one-line UserError when another session holds it."""
        path = journal_path(output)
        try:
            handle = open(path, "r+b")
        except OSError as e:
            raise UserError(f"cannot open {path} ({e.strerror}); pass another --output") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise UserError(f"--output {output} is being labelled by another session (it holds {path.name}); "
                            "use that page, or stop it first") from None
        return cls(path, handle)

    @classmethod
    def write_new(cls, output: Path, header: dict) -> Journal:
        """A new journal of ``header`` alone, written whole under a temporary name and linked into place (refused if a
        file appeared there meanwhile), then locked."""
        path = journal_path(output)
        fd, tmp = tempfile.mkstemp(prefix=f"{TMP}~{HOST}~{os.getpid()}~{path.name}~", dir=output.parent)
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp makes it owner-only; a label file's journal need not be
            with os.fdopen(fd, "wb") as f:
                f.write(json.dumps(header).encode() + b"\n")
                f.flush()
                os.fsync(f.fileno())
            os.link(tmp, path)
        except FileExistsError:
            raise UserError(f"{path} appeared while the items were sampled; pass another --output") from None
        finally:
            os.unlink(tmp)
        fsync_dir(output.parent)
        handle = open(path, "r+b")
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(path, handle)

    def read(self, output: Path) -> tuple[dict, list[dict], int]:
        """The header, the complete events, and the byte length of the complete lines; one-line UserError for a file
        that is not our journal of ``output``."""
        data = self.handle.read()
        lines = data.split(b"\n")
        complete = len(data) - len(lines[-1])  # the last piece has no newline: cut by a kill, or empty
        try:
            header = json.loads(lines[0]) if complete else None
            events = [json.loads(line) for line in lines[1:-1]]
        except (json.JSONDecodeError, UnicodeDecodeError):
            header = events = None
        if not isinstance(header, dict) or header.get("lmhp_label_session") != VERSION or events is None:
            raise UserError(f"{self.path} is not a labelling session's journal, so --output {output} is not ours to "
                            "write; pass another --output")
        if header.get("output") != output.name:
            raise UserError(f"{self.path} is the journal of {header.get('output')}, not of {output.name}; pass another "
                            "--output")
        return header, events, complete

    def cut_to(self, complete: int) -> None:
        """Drop a last line cut by a kill: it was never acknowledged."""
        if complete < self.path.stat().st_size:
            self.handle.truncate(complete)
            os.fsync(self.handle.fileno())

    def append(self, event: dict) -> None:
        """Write ``event`` as one line and fsync it; a line that could not be written whole is taken back."""
        line = json.dumps({**event, "time": round(time.time(), 3)}).encode() + b"\n"
        fd = self.handle.fileno()
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            if os.write(fd, line) != len(line):
                raise OSError(errno.ENOSPC, "the journal took part of the line")
            os.fsync(fd)
        except OSError:
            os.ftruncate(fd, end)  # a choice that was not saved leaves no line behind (the page says so)
            raise

    def close(self) -> None:
        self.handle.close()


class LabelSession:
    """A session's items and decisions, its locked journal and its label file; thread-safe."""

    def __init__(self, output: Path, journal: Journal, header: dict, events: list[dict]):
        self.output, self.journal, self.header = output, journal, header
        self.items: list[dict] = header["items"]
        self.decisions = Decisions()
        for event in events:
            self.decisions.apply(event)
        self.held: dict[str, tuple[int, float]] = {}  # client -> (item shown to it, when)
        self.lock = threading.Lock()

    # ------------------------------------------------------------------ opening
    @classmethod
    def resume(cls, output: Path, flags: dict) -> Optional[LabelSession]:
        """The session whose journal sits beside ``output``, checked and locked; None when there is none (and ``output``
        is free for a new one). One-line UserError for anything at these paths that is not ours, or another session's."""
        path = journal_path(output)
        if output.is_dir() or path.is_dir():
            raise UserError(f"--output {output} is a directory; pass the path of a label file (JSON) to write")
        if not path.exists():
            if output.exists():
                raise UserError(f"--output {output} exists and no labelling session wrote it (no {path.name} beside "
                                "it); pass a new path: the tool never overwrites a file it did not write")
            check_writable(output.parent)
            return None
        journal = Journal.lock(output)
        try:
            header, events, complete = journal.read(output)
            check_flags(header, flags, output)
            session = cls(output, journal, header, events[:-1])
            renders = [render(session.items, session.decisions.best)]  # before the last choice, and after it
            for event in events[-1:]:
                session.decisions.apply(event)
                renders.append(render(session.items, session.decisions.best))
            check_output_is_ours(output, journal.path, renders)
        except UserError:
            journal.close()
            raise
        journal.cut_to(complete)
        if not output.exists() or output.read_bytes() != renders[-1]:
            session.write_output()
        return session

    @classmethod
    def create(cls, output: Path, flags: dict, items: list[dict]) -> LabelSession:
        """A new session: its journal (Journal.write_new), then an empty label file."""
        output.parent.mkdir(parents=True, exist_ok=True)
        header = {"lmhp_label_session": VERSION, "output": output.name, "flags": flags, "items": items}
        session = cls(output, Journal.write_new(output, header), header, [])
        session.write_output()
        return session

    def close(self) -> None:
        self.journal.close()

    # ------------------------------------------------------------------ what the page asks
    def progress_line(self) -> str:
        """"12 of 100 items labelled, 1 skipped", for the terminal."""
        with self.lock:
            labelled, skipped = len(self.decisions.best), len(self.decisions.skipped)
        return f"{labelled} of {len(self.items)} items labelled, {skipped} skipped"

    def state(self, client: str) -> dict:
        """The item to show ``client`` (None when every item is decided) and the session's progress."""
        with self.lock:
            return self._state(client)

    def label(self, client: str, item: int, best: int) -> tuple[bool, dict]:
        """Record ``client``'s choice of sample ``best`` for ``item`` -> (recorded, state). Refused (False) when the
        item was decided already, by this tab or another."""
        if not 0 <= best < N_SAMPLES:
            raise ValueError(f"best must be in 0..{N_SAMPLES - 1}")
        return self._decide({"event": "label", "item": item, "best": best, "client": client})

    def skip(self, client: str, item: int) -> tuple[bool, dict]:
        """Record that ``client`` skipped ``item`` (it is not offered again) -> (recorded, state)."""
        return self._decide({"event": "skip", "item": item, "client": client})

    def undo(self, client: str) -> tuple[bool, dict]:
        """Take back ``client``'s last label or skip still in effect; the item is shown to it again -> (undone, state)."""
        with self.lock:
            mine = self.decisions.history.get(client)
            if not mine:
                return False, self._state(client)
            item = mine[-1]
            self._record({"event": "undo", "item": item, "client": client})
            self.held[client] = (item, time.monotonic())
            return True, self._state(client)

    # ------------------------------------------------------------------ inside the lock
    def _decide(self, event: dict) -> tuple[bool, dict]:
        if not 0 <= event["item"] < len(self.items):
            raise ValueError(f"item must be in 0..{len(self.items) - 1}")
        with self.lock:
            if not self.decisions.is_open(event["item"]):
                return False, self._state(event["client"])
            self._record(event)
            self.held.pop(event["client"], None)
            return True, self._state(event["client"])

    def _record(self, event: dict) -> None:
        """Journal ``event`` durably, apply it, then rewrite the label file."""
        self.journal.append(event)
        self.decisions.apply(event)
        self.write_output()

    def write_output(self) -> None:
        """Rewrite the label file from the decisions."""
        write_label_file(self.output, render(self.items, self.decisions.best))

    def _next_item(self, client: str) -> Optional[int]:
        """The item this client holds if still open, else the first open item no other tab holds (leases expire)."""
        now = time.monotonic()
        mine = self.held.get(client)
        if mine is not None and self.decisions.is_open(mine[0]):
            return mine[0]
        taken = {i for c, (i, since) in self.held.items() if c != client and now - since < LEASE_S}
        for i in range(len(self.items)):
            if self.decisions.is_open(i) and i not in taken:
                self.held[client] = (i, now)
                return i
        self.held.pop(client, None)
        return None

    def _state(self, client: str) -> dict:
        i = self._next_item(client)
        item = None if i is None else {"index": i, "query": self.items[i]["query_text"],
                                       "samples": self.items[i]["sample_texts"]}
        return {"item": item, "labelled": len(self.decisions.best), "skipped": len(self.decisions.skipped),
                "total": len(self.items), "can_undo": bool(self.decisions.history.get(client)),
                "output": str(self.output)}


def check_flags(header: dict, flags: dict, output: Path) -> None:
    """A session continues only with the flags that made its items."""
    flags = json.loads(json.dumps(flags))  # as the journal holds them (tuples become lists)
    differ = sorted(k for k in set(flags) | set(header["flags"]) if flags.get(k) != header["flags"].get(k))
    if differ:
        was = ", ".join(f"{k}={header['flags'].get(k)!r}" for k in differ)
        raise UserError(f"--output {output} is a session made with {was}; pass the same flags to continue it, or "
                        "another --output for a new one")


def check_output_is_ours(output: Path, journal: Path, renders: list[bytes]) -> None:
    """The label file holds what the journal's choices give (or, after a kill between the two writes, the choices but
    the last), or is missing; else the user changed it, and it is theirs now."""
    if output.exists() and output.read_bytes() not in renders:
        raise UserError(f"--output {output} was changed since the labelling session wrote it; move it away (the "
                        f"session rewrites it from {journal.name}) or pass another --output")


def check_writable(directory: Path) -> None:
    """The label file's directory, or the nearest one that exists, is a directory this process can write in."""
    existing = next(p for p in (directory.absolute(), *directory.absolute().parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"cannot write the label file in {directory} ({existing} is not a writable directory); pass "
                        "an --output in a directory you can write")
