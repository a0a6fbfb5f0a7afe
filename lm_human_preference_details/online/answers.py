"""The online collection's requests and the durable record of every answer to them (collection.py's).

A request is keyed by where it was made: its batch of requests and its position in that batch. A resumed run makes
the requests after its checkpoint again, the same ones (their queries and samples come from seeded generators), so an
answer recorded under a request's key, with the same hash of its tokens, is that request's answer: it is used again,
never asked again. The record, RUN/online/answers.jsonl, is one JSON line per answer, appended and fsynced before the
answer counts anywhere (a label the page shows as saved is in it), so a kill -9 loses no given answer; a line cut
short by a kill (no newline yet) was never acknowledged and is dropped when the record is opened again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from lm_human_preference_details.labelling.journal import ANONYMOUS, is_int, labeller_problem
from lm_human_preference_details.utils.errors import UserError

UNKNOWN = object()  # no answer recorded for a request (None is an answer: the request was skipped)


@dataclass(frozen=True)
class Request:
    """One best-of-4 request: a query and four samples of the policy (token ids, the run's pads), made before
    ``update`` as position ``position`` of batch ``batch``."""

    batch: int
    position: int
    update: int
    query: list[int]
    samples: list[list[int]]

    @property
    def key(self) -> str:
        return f"{self.batch}/{self.position}"

    @property
    def digest(self) -> str:
        """A hash of the request's tokens: an answer is reused only for the very request it answered."""
        return hashlib.sha256(json.dumps([self.query, self.samples]).encode()).hexdigest()[:32]

    def as_dict(self) -> dict:
        """The request in types a checkpoint holds (torch.load weights_only)."""
        return {"batch": self.batch, "position": self.position, "update": self.update, "query": self.query,
                "samples": self.samples}


class AnswerRecord:
    """RUN/online/answers.jsonl: {"key", "hash", "best", "labeller"} a line (best null: skipped), append-only, fsynced
    per answer. A line without "labeller" (recorded before labellers had names) is ANONYMOUS's."""

    def __init__(self, path: Path):
        self.path = path
        self.answers: dict[str, tuple[str, Optional[int], str]] = {}  # key -> (hash, best, labeller)
        for where, kind, is_kind in ((path.parent, "a directory", Path.is_dir), (path, "a file", Path.is_file)):
            if os.path.lexists(where) and not is_kind(where):
                raise UserError(f"{where} is not {kind}: the run keeps its answers there; move it away (or put back the "
                                "run's own) and run the same command again")
        path.parent.mkdir(parents=True, exist_ok=True)
        complete = self._read() if path.is_file() else 0
        self.file = open(path, "ab", buffering=0)  # unbuffered: a line not kept is never written later by a flush
        self.file.truncate(complete)  # drop a line a kill cut short: it was never acknowledged

    def _read(self) -> int:
        """Load the complete lines -> the length in bytes they take."""
        data = self.path.read_bytes()
        complete = data.rfind(b"\n") + 1
        for number, line in enumerate(data[:complete].splitlines(), 1):
            try:
                record = json.loads(line)
                key, digest, best = record["key"], record["hash"], record["best"]
                labeller = record.get("labeller", ANONYMOUS)
            except (ValueError, KeyError, TypeError, AttributeError):
                key = digest = best = labeller = None
            # a best is an index 0..3 or null (skipped), checked here as it is read, not when a model trains on it
            if not (isinstance(key, str) and isinstance(digest, str) and labeller_problem(labeller) is None and
                    (best is None or is_int(best) and 0 <= best < 4)):
                raise UserError(f"{self.path} line {number} is not an answer this run recorded; the file was changed: "
                                "restore it or start a new run (--output-dir)") from None
            self.answers[key] = (digest, best, labeller)
        return complete

    def __len__(self) -> int:
        return len(self.answers)

    def labels(self) -> set[tuple[str, int]]:
        """(hash, best) of every answer that is a label (not a skip)."""
        return {(digest, best) for digest, best, _ in self.answers.values() if best is not None}

    def get(self, request: Request):
        """The answer recorded for ``request`` (an index, or None: skipped), or UNKNOWN."""
        digest, best, _ = self.answers.get(request.key, (None, None, None))
        return best if digest == request.digest else UNKNOWN

    def labeller(self, request: Request) -> str:
        """Who gave the answer recorded for ``request`` (`get` says whether there is one)."""
        return self.answers[request.key][2]

    def record(self, request: Request, best: Optional[int], labeller: str) -> None:
        """Append ``request``'s answer by ``labeller`` and fsync it: once this returns, a kill -9 does not lose it; when
        it raises (a full disk), the record is as it was before, so a resume never takes the refused answer for a label."""
        line = {"key": request.key, "hash": request.digest, "best": best, "labeller": labeller}
        data = (json.dumps(line) + "\n").encode()
        fd = self.file.fileno()
        end = os.fstat(fd).st_size
        try:
            while data:
                data = data[os.write(fd, data):]
            os.fsync(fd)
        except OSError:  # a full disk: the page says "not kept", so no part of the line may stay to be read on a resume
            try:
                os.ftruncate(fd, end)
            except OSError:
                pass
            raise
        self.answers[request.key] = (request.digest, best, labeller)

    def close(self) -> None:
        self.file.close()
