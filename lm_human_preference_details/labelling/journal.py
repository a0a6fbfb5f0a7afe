"""The label tool's journal: the file of record of a labelling session, OUTPUT.session.jsonl, replayed on restart.

Line 1 is the session (its flags and every item's tokens and texts), then one line per choice (label, skip, undo; each
names its tab, "client", and its labeller, "labeller"), appended and fsynced before the page hears "saved". Replaying
it gives the session's Decisions; every line is checked as it is replayed, so a journal edited by hand (or by another
program) is one line naming its line number, never a session built on events this tool could not have written.
"""

from __future__ import annotations

import errno
import fcntl
import json
import math
import os
import time
from collections import Counter
from pathlib import Path
from typing import Optional

from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import synced_temporary

VERSION = 1  # of the journal's format: events without "labeller" (written before names) are ANONYMOUS's
N_SAMPLES = 4  # best_of_4, the type of every label file OpenAI released
ANONYMOUS = "anonymous"  # the labeller of an event that names none (a journal written before labellers had names)
MAX_NAME = 64  # characters of a labeller's name
TRAIN_ON = ("first", "majority")  # which of an item's labels trains (training_label)
# the session flags a journal written before they existed was made with
SESSION_DEFAULTS = {"labels_per_item": 1, "repeat_share": 1.0, "train_on": "first"}


def journal_path(output: Path) -> Path:
    """The journal beside the label file ``output``."""
    return output.with_name(output.name + ".session.jsonl")


def is_int(value) -> bool:
    """A JSON integer (bool is an int to Python, not to JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def int_lists(value, count: Optional[int] = None) -> bool:
    """A list of lists of ints (``count`` of them when given)."""
    return (isinstance(value, list) and (count is None or len(value) == count)
            and all(isinstance(x, list) and all(is_int(t) for t in x) for x in value))


def header_problem(header) -> Optional[str]:
    """Why ``header`` (line 1) is not a session's header, or None."""
    if not isinstance(header, dict) or header.get("lmhp_label_session") != VERSION:
        return "not a labelling session's header"
    if not isinstance(header.get("output"), str) or not isinstance(header.get("flags"), dict):
        return "no output name or flags"
    flags = {**SESSION_DEFAULTS, **header["flags"]}
    if not (is_int(flags["labels_per_item"]) and flags["labels_per_item"] >= 1 and flags["train_on"] in TRAIN_ON
            and isinstance(flags["repeat_share"], (int, float)) and 0 <= flags["repeat_share"] <= 1):
        return "labels_per_item, repeat_share or train_on is not one the tool takes"
    items = header.get("items")
    if not isinstance(items, list) or not items:
        return "no items"
    n = samples_per_item(header)
    for i, item in enumerate(items):
        texts = item.get("sample_texts") if isinstance(item, dict) else None
        if not (int_lists([item.get("query")]) and int_lists(item.get("samples"), n)
                and isinstance(item.get("query_text"), str) and isinstance(texts, list) and len(texts) == n
                and all(isinstance(t, str) for t in texts)):
            return f"item {i} is not a query with {n} samples, as tokens and texts"
    return None


def samples_per_item(header: dict) -> int:
    """The samples every item of a session shows: 4 (best of four, the label tool), or 2 as its header's flags say (a
    comparison of two policies, the evaluation command)."""
    n = header["flags"].get("samples_per_item", N_SAMPLES)
    return n if is_int(n) and 2 <= n <= N_SAMPLES else N_SAMPLES


class Decisions:
    """What the events of a journal decided: each item's labels (who chose which sample, in the order given), who
    skipped it, and each tab's undoable choices, in order. Item i wants ``wants[i]`` labels, each from another labeller;
    it is open to a labeller while it has fewer and that labeller has neither labelled nor skipped it."""

    def __init__(self, wants: list[int], n_samples: int = N_SAMPLES) -> None:
        self.wants, self.n_samples = wants, n_samples
        self.labels: dict[int, list[tuple[str, int]]] = {}  # item -> [(labeller, chosen sample)], in the order given
        self.skipped: dict[int, set[str]] = {}  # item -> the labellers who skipped it
        self.history: dict[str, list[tuple[int, str]]] = {}  # client -> the (item, labeller) it decided, oldest first

    @classmethod
    def of(cls, header: dict) -> Decisions:
        """No decisions yet, for the items and flags of a session's ``header``."""
        flags = {**SESSION_DEFAULTS, **header["flags"]}
        return cls(wanted_labels(len(header["items"]), flags["labels_per_item"], flags["repeat_share"]),
                   samples_per_item(header))

    def after(self, event: dict) -> Decisions:
        """The decisions once ``event`` is applied (self unchanged: the event is applied only once it is saved)."""
        new = Decisions(self.wants, self.n_samples)
        new.labels = {item: list(labels) for item, labels in self.labels.items()}
        new.skipped = {item: set(who) for item, who in self.skipped.items()}
        new.history = {client: list(items) for client, items in self.history.items()}
        new.apply(event)
        return new

    def problem(self, event) -> Optional[str]:
        """Why ``event`` is not one this tool could have written next, or None."""
        if not isinstance(event, dict) or event.get("event") not in ("label", "skip", "undo"):
            return "not a label, skip or undo"
        item, client, labeller = event.get("item"), event.get("client"), event.get("labeller", ANONYMOUS)
        if not isinstance(client, str):
            return "no client"
        if (why := labeller_problem(labeller)) is not None:
            return why
        if not is_int(item) or not 0 <= item < len(self.wants):
            return f"item {item!r} is not in 0..{len(self.wants) - 1}"
        if event["event"] == "undo":
            mine = self.history.get(client)
            return None if mine and mine[-1] == (item, labeller) else \
                f"an undo of item {item} that client {client!r} did not decide last as {labeller!r}"
        if any(who == labeller for who, _ in self.labels.get(item, ())):
            return f"labeller {labeller!r} labelled item {item} already"
        if labeller in self.skipped.get(item, ()):
            return f"labeller {labeller!r} skipped item {item} already"
        if len(self.labels.get(item, ())) >= self.wants[item]:
            return f"item {item} has the {self.wants[item]} label(s) it wants already"
        best = event.get("best")
        if event["event"] == "label" and not (is_int(best) and 0 <= best < self.n_samples):
            return f"best {best!r} is not in 0..{self.n_samples - 1}"
        return None

    def apply(self, event: dict) -> None:
        """Replay one event (checked by ``problem``)."""
        item, client, labeller = event["item"], event["client"], event.get("labeller", ANONYMOUS)
        if event["event"] == "undo":
            self.labels[item] = [label for label in self.labels.get(item, ()) if label[0] != labeller]
            if not self.labels[item]:
                del self.labels[item]
            self.skipped.get(item, set()).discard(labeller)
            self.history[client].pop()
            return
        if event["event"] == "label":
            self.labels.setdefault(item, []).append((labeller, event["best"]))
        else:
            self.skipped.setdefault(item, set()).add(labeller)
        self.history.setdefault(client, []).append((item, labeller))

    def still_wanted(self, item: int) -> int:
        """The labels item ``item`` still wants."""
        return self.wants[item] - len(self.labels.get(item, ()))

    def is_open(self, item: int, labeller: str = ANONYMOUS) -> bool:
        """Whether ``labeller`` may label ``item``: it wants another label, and this labeller has not decided it."""
        return (self.still_wanted(item) > 0 and labeller not in self.skipped.get(item, ())
                and all(who != labeller for who, _ in self.labels.get(item, ())))

    def counts(self) -> tuple[int, int, int]:
        """(labels given, skips, labels wanted in all)."""
        return (sum(map(len, self.labels.values())), sum(map(len, self.skipped.values())), sum(self.wants))


def wanted_labels(n_items: int, labels_per_item: int, repeat_share: float) -> list[int]:
    """How many labels each item wants: the first round(repeat_share * n_items) items (halves up) ``labels_per_item``,
    the others one (the paper's practice: a share of the items labelled more than once)."""
    repeated = math.floor(repeat_share * n_items + 0.5)
    return [labels_per_item if i < repeated else 1 for i in range(n_items)]


def training_label(labels: list[tuple[str, int]], train_on: str) -> tuple[str, int]:
    """The (labeller, best) that trains of an item's ``labels`` (in the order given): first, the first label; majority,
    the most chosen sample, a tie settled by the earliest label among the tied samples."""
    if train_on == "first":
        return labels[0]
    counts = Counter(best for _, best in labels)
    top = max(counts.values())
    return next(label for label in labels if counts[label[1]] == top)


def labeller_name(name) -> Optional[str]:
    """A labeller's name as every route takes it (the page's, a label file's, the command labeller's): ``name`` with
    the blanks at either end trimmed, then 1..64 printable characters -> it, or None. "ann " is "ann": one person is
    one labeller."""
    if not isinstance(name, str):
        return None
    name = name.strip()
    return name if 0 < len(name) <= MAX_NAME and name.isprintable() else None


def labeller_problem(name) -> Optional[str]:
    """Why ``name`` is not a labeller's name (`labeller_name`), or None."""
    if labeller_name(name) is None:
        return f"labeller must be a string of 1..{MAX_NAME} printable characters (blanks at either end are trimmed)"
    return None


class SessionJournal:
    """A session's journal file, open and locked (flock) while the session runs: read once, then appended to."""

    def __init__(self, path: Path, handle):
        self.path, self.handle = path, handle

    @classmethod
    def lock(cls, output: Path) -> SessionJournal:
        """The journal beside ``output``, opened (never through a link) and locked; one-line UserError when another
        session holds it."""
        path = journal_path(output)
        try:
            handle = os.fdopen(os.open(path, os.O_RDWR | os.O_NOFOLLOW), "r+b")
        except OSError as e:
            why = "it is a symbolic link" if e.errno == errno.ELOOP else e.strerror
            raise UserError(f"cannot open {path} ({why}); pass another --output") from None
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            raise UserError(f"--output {output} is being labelled by another session (it holds {path.name}); "
                            "use that page, or stop it first") from None
        return cls(path, handle)

    @classmethod
    def write_new(cls, output: Path, header: dict) -> SessionJournal:
        """A new journal of ``header`` alone, written whole under a temporary name and linked into place (refused if a
        file appeared there meanwhile), then locked."""
        path = journal_path(output)
        tmp = synced_temporary(path, json.dumps(header).encode() + b"\n")
        try:
            os.link(tmp, path)  # link() never follows or replaces what is at path, a dangling link included
        except FileExistsError:
            raise UserError(f"{path} appeared while the items were sampled; pass another --output") from None
        finally:
            os.unlink(tmp)
        fsync_dir(output.parent)
        handle = open(path, "r+b")
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return cls(path, handle)

    def read(self, output: Path) -> tuple[dict, list[dict], int]:
        """The header, the events (each checked against those before it), and the byte length of the complete lines;
        one-line UserError for a file that is not our journal of ``output``, naming the first line that is wrong."""
        data = self.handle.read()
        lines = data.split(b"\n")
        complete = len(data) - len(lines[-1])  # the last piece has no newline: cut by a kill, or empty
        header = parse_line(lines[0]) if complete else None
        if not isinstance(header, dict) or header.get("lmhp_label_session") != VERSION:
            raise UserError(f"{self.path} is not a labelling session's journal, so --output {output} is not ours to "
                            "write; pass another --output")
        if header.get("output") != output.name:
            raise UserError(f"{self.path} is the journal of {header.get('output')}, not of {output.name}; pass another "
                            "--output")
        why = header_problem(header)
        if why:
            raise self.damaged(1, why, output)
        decisions, events = Decisions.of(header), []
        for number, line in enumerate(lines[1:-1], start=2):
            event = parse_line(line)
            why = "not JSON" if event is None else decisions.problem(event)
            if why:
                raise self.damaged(number, why, output)
            decisions.apply(event)
            events.append(event)
        return header, events, complete

    def damaged(self, number: int, why: str, output: Path) -> UserError:
        return UserError(f"{self.path} line {number} is not an event this tool writes ({why}): the journal was "
                         f"changed by hand or by another program; move {self.path.name} and {output.name} away, or "
                         "pass another --output")

    def cut_to(self, complete: int) -> None:
        """Drop a last line cut by a kill: it was never acknowledged."""
        if complete < os.fstat(self.handle.fileno()).st_size:
            self.take_back(complete)

    def append(self, event: dict) -> int:
        """Write ``event`` as one line and fsync it -> the journal's length before it (for take_back); a line that
        could not be written whole is taken back."""
        line = json.dumps({**event, "time": round(time.time(), 3)}).encode() + b"\n"
        fd = self.handle.fileno()
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            if os.write(fd, line) != len(line):
                raise OSError(errno.ENOSPC, "the journal took part of the line")
            os.fsync(fd)
        except OSError:
            self.take_back(end)  # a choice that was not saved leaves no line behind (the page says so)
            raise
        return end

    def take_back(self, end: int) -> None:
        """Cut the journal back to ``end`` bytes (shrinking a file needs no space)."""
        os.ftruncate(self.handle.fileno(), end)
        os.fsync(self.handle.fileno())

    def close(self) -> None:
        self.handle.close()


def parse_line(line: bytes):
    """One journal line's JSON (NaN and Infinity refused, as JSON has neither), or None."""
    try:
        return json.loads(line, parse_constant=refuse_constant)
    except (ValueError, UnicodeDecodeError):
        return None


def refuse_constant(name: str) -> None:
    """json's hook for NaN, Infinity and -Infinity: not JSON, and not a number any field may hold."""
    raise ValueError(f"{name} is not JSON")


def fsync_dir(directory: Path) -> None:
    """Make a rename or a new name in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
