"""The online run's label file, RUN/online/labels.json: OpenAI's best-of-4 schema, rewritten whole after each batch of
answers, checked against the checkpoint and the answers on resume."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Optional

from lm_human_preference_details.labelling.answers import AnswerRecord, Request
from lm_human_preference_details.labelling.journal import is_int
from lm_human_preference_details.labels import OAI_PAD
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import atomic_path

BEST_OF = 4  # the paper's best-of-4 comparisons (labels.type best_of_4)


class OnlineLabelFile:
    """The run's labels, RUN/online/labels.json: a JSON list in OpenAI's best-of-4 schema (pads 50259) with the policy
    update that sampled each; rewritten whole and atomically after each batch, so a kill never leaves half a record,
    and read by train_reward.py's --labels.source as it is."""

    def __init__(self, path: Path):
        self.path = path
        self.records: list[dict] = read_journal(path)

    def __len__(self) -> int:
        return len(self.records)

    def digest(self, n: int) -> str:
        """A hash of the first ``n`` records: a checkpoint holds it, so a resume finds a journal cut or changed."""
        return hashlib.sha256(json.dumps(self.records[:n]).encode()).hexdigest()

    def keep(self, n: int) -> None:
        """Drop the records past the first ``n`` (a resumed run makes them again, the same ones)."""
        if len(self.records) > n:
            self.records = self.records[:n]
            self._write()

    def add(self, answered: list[tuple[Request, Optional[int], str]], pad_id: int) -> None:
        """Requests, their answers (None: skipped, not kept) and who gave them, in the order given."""
        to_oai = lambda tokens: [OAI_PAD if t == pad_id else t for t in tokens]  # noqa: E731
        for request, best, labeller in answered:
            if best is None:
                continue
            self.records.append({"query": to_oai(request.query),
                                 **{f"sample{i}": to_oai(request.samples[i]) for i in range(BEST_OF)},
                                 "best": best, "update": request.update, "labeller": labeller})
        self._write()

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

    def _write(self) -> None:
        with atomic_path(self.path) as tmp:
            tmp.write_text(json.dumps(self.records))
            with open(tmp, "rb+") as f:
                os.fsync(f.fileno())


RECOVER = "restore it from a copy, or start the run again with --overwrite (its labels are then lost)"


def read_journal(path: Path) -> list[dict]:
    """The journal's records (none when there is no journal), or a one-line UserError naming the file when it is not
    the journal this run wrote: not a file, not JSON (cut), or not a list of best-of-4 records."""
    if not os.path.lexists(path):
        return []
    if not path.is_file():
        raise UserError(f"{path} is not a file; it is the run's journal of labels: {RECOVER}")
    try:
        records = json.loads(path.read_bytes())
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{path} is not JSON: it was cut or changed (the run writes it whole); {RECOVER}") from None
    if not isinstance(records, list) or not all(isinstance(r, dict) and is_int(r.get("best")) and 0 <= r["best"] < BEST_OF
                                                for r in records):
        raise UserError(f"{path} is not a list of best-of-{BEST_OF} records: it was changed; {RECOVER}")
    return records
