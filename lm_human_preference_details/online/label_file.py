"""The online run's label file, RUN/online/labels.json: OpenAI's best-of-4 schema, one record a line, grown by appending
(the cost of a label does not grow with the file), checked against the checkpoint and the answers on resume."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from pathlib import Path
from typing import Optional

from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.labelling.journal import is_int
from lm_human_preference_details.online.answers import AnswerRecord, Request
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import atomic_path

BEST_OF = 4  # the paper's best-of-4 comparisons (labels.type best_of_4)
OPEN, CLOSE = b"[", b"\n]\n"  # the file: OPEN, each record on a line of its own (after "\n", then ",\n"), CLOSE


def record_lines(records: list[dict], after: int = 0) -> list[bytes]:
    """Each record's line as the file holds it, led by its separator ("\n" before the file's first record, ",\n"
    before the others); ``after``: the records before them in the file."""
    return [(b",\n" if after + i else b"\n") + json.dumps(r).encode() for i, r in enumerate(records)]


def line_ends(lines: list[bytes], start: int) -> list[int]:
    """The byte offset where each of ``lines`` ends (before the next "," or the closing "\n]"), the first from ``start``."""
    return list(itertools.accumulate(map(len, lines), initial=start))[1:]


def layout(records: list[dict]) -> tuple[bytes, list[int]]:
    """The file's bytes for ``records`` (a JSON list, one record a line, so that records are added at the end by
    rewriting only the closing bracket) and where each record's line ends in them."""
    lines = record_lines(records)
    return OPEN + b"".join(lines) + CLOSE, line_ends(lines, len(OPEN))


class OnlineLabelFile:
    """The run's labels, RUN/online/labels.json: a JSON list in OpenAI's best-of-4 schema (pads 50259) with the policy
    update that sampled each, read by train_reward.py's --labels.source as it is.

    One record a line: a batch of answers is added by writing over the closing bracket (",\\n" + the records + "\\n]\\n")
    and an fsync, so a label costs the same at the 60,000th record as at the first; a power cut in that write may leave
    a file whose last line is cut, which the next start cuts back to its last whole record (the answers' record keeps every
    answer, and a resume makes the records past its checkpoint again)."""

    def __init__(self, path: Path, owner: bool = True):
        """``owner``: this process writes the file (under torchrun, process 0); the others only read it, as it is."""
        self.path = path
        self.records: list[dict] = []
        self.ends: list[int] = []  # byte offset of the end of each record's line (before its ",")
        data = read_label_file(path)
        if data is not None:
            self.records, self.ends, whole = parse_layout(path, data)
            if not whole and owner:  # an older run's one-line file, or a last write torn: laid out again
                self._write_whole()

    def __len__(self) -> int:
        return len(self.records)

    def digest(self, n: int) -> str:
        """A hash of the first ``n`` records: a checkpoint holds it, so a resume finds a label file cut or changed."""
        return hashlib.sha256(json.dumps(self.records[:n]).encode()).hexdigest()

    def keep(self, n: int) -> None:
        """Drop the records past the first ``n`` (a resumed run makes them again, the same ones)."""
        if len(self.records) > n:
            self.records, self.ends = self.records[:n], self.ends[:n]
            self._write_at(self.ends[-1] if n else len(OPEN), b"")

    def add(self, answered: list[tuple[Request, Optional[int], str]], pad_id: int) -> None:
        """Requests, their answers (None: skipped, not kept) and who gave them, in the order given: appended."""
        to_oai = lambda tokens: [OAI_PAD if t == pad_id else t for t in tokens]  # noqa: E731
        new = [{"query": to_oai(request.query), **{f"sample{i}": to_oai(request.samples[i]) for i in range(BEST_OF)},
                "best": best, "update": request.update, "labeller": labeller}
               for request, best, labeller in answered if best is not None]
        if not new:
            return
        if not os.path.exists(self.path):
            self._write_whole()
        start = self.ends[-1] if self.ends else len(OPEN)  # where the closing "\n]\n" begins
        lines = record_lines(new, after=len(self.records))
        self._write_at(start, b"".join(lines))
        self.ends.extend(line_ends(lines, start))
        self.records.extend(new)

    def check_resumed(self, labels: int, digest: Optional[str], answers: AnswerRecord, pad_id: int) -> None:
        """On resume: the file holds the checkpoint's ``labels`` records as they were (``digest``), and each is an
        answer of the record (answers.jsonl); a file cut, emptied or changed since is one line naming it, never a run
        that differs or waits for labels that cannot come."""
        if len(self) < labels or (digest is not None and self.digest(labels) != digest):
            what = f"holds {len(self)} records, fewer than" if len(self) < labels else "differs from"
            raise UserError(f"{self.path} {what} the checkpoint's {labels}: it was cut or changed since the "
                            f"checkpoint; {RECOVER}")
        given = answers.labels()
        from_oai = lambda tokens: [pad_id if t == OAI_PAD else t for t in tokens]  # noqa: E731
        for i, record in enumerate(self.records[:labels]):
            request = Request(0, 0, 0, from_oai(record["query"]), [from_oai(record[f"sample{k}"]) for k in range(BEST_OF)])
            if (request.digest, record["best"]) not in given:
                raise UserError(f"{answers.path} has no answer for record {i} of {self.path.name}: it was cut "
                                f"or changed since the checkpoint; {RECOVER}")

    def _write_at(self, start: int, body: bytes) -> None:
        """Write ``body`` and the closing bracket at byte ``start``, cut the file there, fsync: the file is a whole
        JSON list again (a power cut in between may leave a last line cut short, which the next start cuts off)."""
        with open(self.path, "r+b") as f:
            f.seek(start)
            f.write(body + CLOSE)
            f.truncate()
            os.fsync(f.fileno())

    def _write_whole(self) -> None:
        """The whole file, written atomically (a new file, or one laid out again)."""
        data, ends = layout(self.records)
        with atomic_path(self.path) as tmp:
            tmp.write_bytes(data)
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())
        self.ends = ends


RECOVER = "restore it from a copy, or start the run again with --overwrite (its labels are then lost)"


def read_label_file(path: Path) -> Optional[bytes]:
    """The label file's bytes (None when there is none), or a one-line UserError naming the file when it is not a
    file."""
    if not os.path.lexists(path):
        return None
    if not path.is_file():
        raise UserError(f"{path} is not a file; it is the run's label file: {RECOVER}")
    return path.read_bytes()


def parse_layout(path: Path, data: bytes) -> tuple[list[dict], list[int], bool]:
    """The records of the file's bytes, the end of each record's line, and whether the file is laid out as this run
    writes it; a last line cut by a kill in an append is dropped (the file is then not whole). A one-line UserError
    naming the file when it is not the label file this run wrote: not JSON, or not a list of best-of-4 records."""
    try:
        records, torn = json.loads(data), False
    except (ValueError, UnicodeDecodeError):
        records, torn = cut_in_append(data), True
        if records is None:
            raise UserError(f"{path} is not JSON: it was cut or changed; {RECOVER}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) and is_int(r.get("best")) and 0 <= r["best"] < BEST_OF
                                                for r in records):
        raise UserError(f"{path} is not a list of best-of-{BEST_OF} records: it was changed; {RECOVER}")
    laid_out, ends = layout(records)  # each record serialised once: the file is read whole at a start
    return records, ends, not torn and data == laid_out


def cut_in_append(data: bytes) -> Optional[list]:
    """The whole records of a file whose last append was torn (a power cut between the write and its fsync): this
    run's layout up to a last record line or closing bracket cut short; None for anything else. What is dropped is
    past the last checkpoint (a resume checks the records it keeps against the checkpoint's hash), and the resumed run
    makes it again from the answers' record."""
    records = []
    for line in data[len(OPEN):].split(b"\n")[1:]:
        try:
            record = json.loads(line.rstrip(b","))
        except (ValueError, UnicodeDecodeError):
            break
        if not isinstance(record, dict):
            break
        records.append(record)
    whole = layout(records)[0][:-len(CLOSE)]
    tail = data[len(whole):]
    sep = b",\n" if records else b"\n"  # what begins the next record's line
    torn_line = (sep.startswith(tail) or tail.startswith(sep)) and b"\n" not in tail[len(sep):]
    return records if data.startswith(whole) and (CLOSE.startswith(tail) or torn_line) else None
