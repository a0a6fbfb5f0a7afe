"""A labelling session of the label tool: its items, its journal and the label file it writes.

Two files, side by side:
    OUTPUT                 the labels so far in OpenAI's best_of_4 schema (what --labels.source reads), rewritten
                           atomically (a temporary, fsync, rename) after each choice: never half-written
    OUTPUT.session.jsonl   the journal, the truth: a session killed at any point (kill -9 included) restarts from it,
                           rewrites OUTPUT from it, and shows the same items
A choice is kept only when both writes succeed: the journal's line is taken back when the label file cannot be
rewritten (a full disk), so the page's "not saved" is true and the same command later continues the session.
OUTPUT is ours only while our journal sits beside it and OUTPUT holds what that journal says; anything else at either
path is the user's and is never written (docs/runs.md): a new label file is linked into place (never over anything),
and each rewrite first checks that the file there is still the one this session wrote. Every method that changes the
session holds one lock, so two browser tabs never label one item twice.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Iterable, Optional

from lm_human_preference_details.labelling.journal import (
    ANONYMOUS,
    SESSION_DEFAULTS,
    VERSION,
    Decisions,
    SessionJournal,
    fsync_dir,
    journal_path,
    training_label,
)
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import cannot_write_in, remove_leftovers, synced_temporary
from lm_human_preference_details.utils.outputs import check_output_file

# how long an item shown to one tab is kept from the others after that tab's last sign of life (the page says it is
# alive every 10 s, label_page.html, and gives its item back when it closes)
LEASE_S = 30.0


def check_output_path(raw: str, inputs: Iterable[Optional[str]] = ()) -> Path:
    """The label file named by --output, as the gate of every output decides (utils/outputs.py): not a directory, a
    link, a path under a file or an input; an existing file only where its journal makes it a session's (which
    `LabelSession.resume` then checks). Else a one-line UserError."""
    return check_output_file(raw, flag="--output", inputs=inputs, ours=lambda path: journal_path(path).is_file(),
                             what="label file", writer="labelling session")


def render(items: list[dict], decisions: Decisions, train_on: str, names: bool = True) -> bytes:
    """The label file of the items labelled so far, in item order: OpenAI's records {query, sample0..3, best} (what
    trains: journal.training_label), with "labeller" (whose label ``best`` is) and "labels" (every label of the item,
    {labeller, best}, in the order given) added; OpenAI's loader and ours ignore the two. ``names`` False: without
    them, as the tool wrote label files before labellers had names."""
    records = []
    for i, labels in sorted(decisions.labels.items()):
        labeller, best = training_label(labels, train_on)
        named = {"labeller": labeller, "labels": [{"labeller": who, "best": b} for who, b in labels]} if names else {}
        records.append({"query": items[i]["query"], **{f"sample{j}": s for j, s in enumerate(items[i]["samples"])},
                        "best": best, **named})
    return json.dumps(records).encode()


def identity(path: Path) -> tuple[int, int]:
    """Which file is at ``path`` (device, inode), the link itself if it is one."""
    st = os.lstat(path)
    return st.st_dev, st.st_ino


def write_label_file(output: Path, data: bytes, previous: Optional[tuple[int, int]]) -> tuple[int, int]:
    """Write the label file (a temporary, fsynced, then put in place) -> its identity. ``previous``: the identity of
    the label file this session wrote last, replaced only if it is still the file there; None: a first write, linked
    into place, so that it never replaces a file that appeared meanwhile."""
    remove_leftovers(output.parent)
    tmp = synced_temporary(output, data)
    try:
        if previous is None or not os.path.lexists(output):  # a first write, or the user removed the file
            try:
                os.link(tmp, output)  # never follows or replaces what is at output, a dangling link included
            except FileExistsError:
                raise UserError(f"--output {output} appeared while this session was writing it; it is not ours, and "
                                "it was left as it is: move it away and run the same command") from None
        else:
            if identity(output) != previous:  # checked right before the write that replaces it
                raise UserError(f"--output {output} was replaced by another program; it is left as it is and the "
                                "choice is not kept: move it away and run the same command")
            os.replace(tmp, output)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    written = identity(output)
    try:
        fsync_dir(output.parent)
    except OSError:
        pass  # the file is in place and the journal holds the choice durably: a restart catches a lost rename up
    return written


class Leases:
    """Which item each tab is shown: kept from the other tabs until LEASE_S after that tab's last sign of life."""

    def __init__(self) -> None:
        self.held: dict[str, tuple[int, float, str]] = {}  # client -> (item shown to it, its last sign of life, labeller)

    def hold(self, client: str, item: int, labeller: str) -> None:
        self.held[client] = (item, time.monotonic(), labeller)

    def renew(self, client: str) -> None:
        if client in self.held:
            item, _, labeller = self.held[client]
            self.hold(client, item, labeller)

    def release(self, client: str) -> None:
        self.held.pop(client, None)

    def mine(self, client: str) -> Optional[int]:
        return self.held[client][0] if client in self.held else None

    def others(self, client: str) -> dict[int, list[str]]:
        """The items other live tabs hold -> the labellers of those tabs (a closed tab's lease ends LEASE_S after its
        last sign of life)."""
        now = time.monotonic()
        held: dict[int, list[str]] = {}
        for c, (i, seen, labeller) in self.held.items():
            if c != client and now - seen < LEASE_S:
                held.setdefault(i, []).append(labeller)
        return held


class StaleChoice(Exception):
    """A choice made on a page that shows an item which is no longer there: answered 409, and the page reloads."""


class PageItems:
    """What the page asks of a session that shows items to tabs (this module's LabelSession, the online run's
    online/page.OnlineSession): one lock, the tabs' leases, and which item each tab is shown. A subclass says which items
    are open to a labeller (``_is_open``), how many labels an item still wants (``_still_wanted``) and what the page is
    told (``_state``, called inside the lock). A tab's lease keeps its item from the other tabs only as many times as
    the item still wants labels, and never from a tab of another labeller more than that."""

    items: list[dict]  # each with "query_text" and "sample_texts"
    requests_named = False  # whether every choice must name its item's request (`check_request`)

    def __init__(self) -> None:
        self.leases = Leases()
        self.lock = threading.Lock()

    def state(self, client: str, labeller: str = ANONYMOUS) -> dict:
        """The item to show ``client``, whose labeller is ``labeller`` (None when no item open to it is free), and the
        session's progress."""
        with self.lock:
            return self._state(client, labeller)

    def alive(self, client: str) -> None:
        """``client``'s tab is still open: the item it is shown stays its own for another LEASE_S."""
        with self.lock:
            self.leases.renew(client)

    def release(self, client: str) -> None:
        """``client``'s tab closed: the item it was shown is free for the others at once."""
        with self.lock:
            self.leases.release(client)

    # ------------------------------------------------------------------ inside the lock
    def _is_open(self, item: int, labeller: str) -> bool:
        raise NotImplementedError

    def _still_wanted(self, item: int) -> int:
        raise NotImplementedError

    def _state(self, client: str, labeller: str) -> dict:
        raise NotImplementedError

    def _free(self, item: int, labeller: str, held: dict[int, list[str]]) -> bool:
        """Whether ``item`` is open to ``labeller`` and the other live tabs (``held``) leave it free: none of them is
        this labeller's, and they are fewer than the labels the item still wants."""
        holders = held.get(item, [])
        return (self._is_open(item, labeller) and labeller not in holders
                and len(holders) < self._still_wanted(item))

    def _next_item(self, client: str, labeller: str) -> Optional[dict]:
        """The item this client holds if still open to its labeller, else the first item free for it (`_free`), as the
        page shows it ({"index", "query", "samples"}); None when there is none."""
        mine = self.leases.mine(client)
        if mine is not None and self._is_open(mine, labeller):
            self.leases.hold(client, mine, labeller)
            return self._shown(mine)
        held = self.leases.others(client)
        for i in range(len(self.items)):
            if self._free(i, labeller, held):
                self.leases.hold(client, i, labeller)
                return self._shown(i)
        self.leases.release(client)
        return None

    def _shown(self, i: int) -> dict:
        return {"index": i, "request": self._request_id(i), "query": self.items[i]["query_text"],
                "samples": self.items[i]["sample_texts"]}

    def _request_id(self, i: int) -> str:
        """What item ``i`` is, for the page to send back with a choice: a hash of its texts."""
        texts = json.dumps([self.items[i]["query_text"], self.items[i]["sample_texts"]])
        return hashlib.sha256(texts.encode()).hexdigest()[:16]

    def check_request(self, item: int, request: Optional[str]) -> None:
        """A choice names the item it was made on (``request``, as `_shown` gave it): a StaleChoice when item ``item``
        is now another (a page shown before a resume, whose indices now name other requests)."""
        with self.lock:
            if request is None and not self.requests_named:
                return
            if item >= len(self.items) or request != self._request_id(item):
                raise StaleChoice(f"item {item} is no longer the request this page showed (the run was resumed since); "
                                  "nothing was kept: the page reloads, choose again")

    def _leased(self, client: str, labeller: str) -> int:
        """How many items open to ``labeller`` other live tabs hold from it."""
        held = self.leases.others(client)
        return sum(self._is_open(i, labeller) and not self._free(i, labeller, held) for i in held)


class LabelSession(PageItems):
    """A session's items and decisions, its locked journal and its label file; thread-safe."""

    def __init__(self, output: Path, journal: SessionJournal, header: dict, events: list[dict]):
        self.output, self.journal, self.header = output, journal, header
        self.items: list[dict] = header["items"]
        self.train_on: str = {**SESSION_DEFAULTS, **header["flags"]}["train_on"]
        self.decisions = Decisions.of(header)
        for event in events:
            self.decisions.apply(event)
        self.written: Optional[tuple[int, int]] = None  # the label file this session wrote last (identity)
        super().__init__()

    # ------------------------------------------------------------------ opening
    @classmethod
    def resume(cls, output: Path, flags: dict) -> Optional[LabelSession]:
        """The session whose journal sits beside ``output``, checked and locked; None when there is none (and ``output``
        is free for a new one). One-line UserError for anything at these paths that is not ours, or another session's."""
        path = check_no_link_or_directory(output)
        if not path.exists():
            if output.exists():
                raise UserError(f"--output {output} exists and no labelling session wrote it (no {path.name} beside "
                                "it); pass a new path: the tool never overwrites a file it did not write")
            check_writable(output.parent)
            return None
        journal = SessionJournal.lock(output)
        try:
            header, events, complete = journal.read(output)
            check_flags(header, flags, output)
            session = cls(output, journal, header, events[:-1])
            # before the last choice, and after it; each also as written before labellers had names
            renders = [session.render(), render(session.items, session.decisions, session.train_on, names=False)]
            for event in events[-1:]:
                session.decisions.apply(event)
                renders += [session.render(), render(session.items, session.decisions, session.train_on, names=False)]
            check_output_is_ours(output, journal.path, renders)
        except UserError:
            journal.close()
            raise
        journal.cut_to(complete)
        if output.exists():
            session.written = identity(output)
        if session.written is None or output.read_bytes() != session.render():
            session.write_output()
        return session

    @classmethod
    def create(cls, output: Path, flags: dict, items: list[dict]) -> LabelSession:
        """A new session: its journal (SessionJournal.write_new), then an empty label file; a label file that appeared
        meanwhile is left as it is, and the journal just written is removed."""
        output.parent.mkdir(parents=True, exist_ok=True)
        header = {"lmhp_label_session": VERSION, "output": output.name, "flags": flags, "items": items}
        session = cls(output, SessionJournal.write_new(output, header), header, [])
        try:
            session.write_output()
        except BaseException:
            session.close()
            os.unlink(session.journal.path)  # ours: written and locked by this process a moment ago
            raise
        return session

    def close(self) -> None:
        self.journal.close()

    # ------------------------------------------------------------------ what the page asks
    def progress_line(self) -> str:
        """"12 of 100 items labelled, 1 skipped" (K labels an item: "12 of 150 labels given, 1 skipped"), for the
        terminal."""
        with self.lock:
            labelled, skipped, wanted = self.decisions.counts()
        given = f"{labelled} of {wanted} labels given" if wanted != len(self.items) else \
            f"{labelled} of {len(self.items)} items labelled"
        return f"{given}, {skipped} skipped"

    def label(self, client: str, item: int, best: int, labeller: str = ANONYMOUS) -> tuple[bool, dict]:
        """Record ``labeller``'s choice (in tab ``client``) of sample ``best`` for ``item`` -> (recorded, state).
        Refused (False) when the item is no longer open to this labeller (Decisions.is_open)."""
        return self._decide({"event": "label", "item": item, "best": best, "client": client, "labeller": labeller})

    def skip(self, client: str, item: int, labeller: str = ANONYMOUS) -> tuple[bool, dict]:
        """Record that ``labeller`` (in tab ``client``) skipped ``item`` (not offered to them again) -> (recorded, state)."""
        return self._decide({"event": "skip", "item": item, "client": client, "labeller": labeller})

    def undo(self, client: str, labeller: str = ANONYMOUS) -> tuple[bool, dict]:
        """Take back ``client``'s last label or skip still in effect; the item is shown to it again -> (undone, state)."""
        with self.lock:
            mine = self.decisions.history.get(client)
            if not mine:
                return False, self._state(client, labeller)
            item, decided_as = mine[-1]
            self._record({"event": "undo", "item": item, "client": client, "labeller": decided_as})
            self.leases.hold(client, item, decided_as)
            return True, self._state(client, labeller)

    # ------------------------------------------------------------------ inside the lock
    def _decide(self, event: dict) -> tuple[bool, dict]:
        with self.lock:
            if self.decisions.problem(event) is not None:  # checked by the server: here, only an item not open
                return False, self._state(event["client"], event["labeller"])
            self._record(event)
            self.leases.release(event["client"])
            return True, self._state(event["client"], event["labeller"])

    def _record(self, event: dict) -> None:
        """SessionJournal ``event`` durably and rewrite the label file; if either fails, neither keeps it."""
        end = self.journal.append(event)
        after = self.decisions.after(event)
        try:
            self.written = write_label_file(self.output, render(self.items, after, self.train_on), self.written)
        except BaseException:
            self.journal.take_back(end)
            raise
        self.decisions = after

    def render(self) -> bytes:
        """The label file the decisions give."""
        return render(self.items, self.decisions, self.train_on)

    def write_output(self) -> None:
        """Rewrite the label file from the decisions."""
        self.written = write_label_file(self.output, self.render(), self.written)

    def _is_open(self, item: int, labeller: str) -> bool:
        return self.decisions.is_open(item, labeller)

    def _still_wanted(self, item: int) -> int:
        return self.decisions.still_wanted(item)

    def _state(self, client: str, labeller: str) -> dict:
        labelled, skipped, wanted = self.decisions.counts()
        return {"item": self._next_item(client, labeller), "labelled": labelled, "skipped": skipped,
                "wanted": wanted, "leased": self._leased(client, labeller), "total": len(self.items),
                "yours": sum(any(who == labeller for who, _ in labels) for labels in self.decisions.labels.values()),
                "can_undo": bool(self.decisions.history.get(client)), "output": str(self.output)}


def check_flags(header: dict, flags: dict, output: Path) -> None:
    """A session continues only with the flags that made its items and its labels (a journal written before a flag
    existed was made with its default, SESSION_DEFAULTS)."""
    flags = json.loads(json.dumps(flags))  # as the journal holds them (tuples become lists)
    made = {**{k: v for k, v in SESSION_DEFAULTS.items() if k in flags}, **header["flags"]}
    differ = sorted(k for k in set(flags) | set(made) if flags.get(k) != made.get(k))
    if differ:
        was = ", ".join(f"{k}={made.get(k)!r}" for k in differ)
        raise UserError(f"--output {output} is a session made with {was}; pass the same flags to continue it, or "
                        "another --output for a new one")


def check_output_is_ours(output: Path, journal: Path, renders: list[bytes]) -> None:
    """The label file holds what the journal's choices give (or, after a kill between the two writes, the choices but
    the last), or is missing; else the user changed it, and it is theirs now."""
    if output.exists() and output.read_bytes() not in renders:
        raise UserError(f"--output {output} was changed since the labelling session wrote it; move it away (the "
                        f"session rewrites it from {journal.name}) or pass another --output")


def check_no_link_or_directory(output: Path) -> Path:
    """Neither the label file nor its journal is a symbolic link or a directory -> the journal's path."""
    path = journal_path(output)
    for p in (output, path):
        if p.is_symlink():
            raise UserError(f"--output {output}: {p} is a symbolic link; the tool never writes through one: pass the "
                            "path of a label file itself")
    if output.is_dir() or path.is_dir():
        raise UserError(f"--output {output} is a directory; pass the path of a label file (JSON) to write")
    return path


def check_writable(directory: Path) -> None:
    """The label file's directory, or the nearest one that exists, is a directory this process can write in."""
    existing = next(p for p in (directory.absolute(), *directory.absolute().parents) if p.exists())
    if not existing.is_dir() or cannot_write_in(existing) is not None:
        raise UserError(f"cannot write the label file in {directory} ({existing} is not a writable directory); pass "
                        "an --output in a directory you can write")
