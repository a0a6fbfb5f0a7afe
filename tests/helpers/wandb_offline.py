"""What an offline W&B run (WANDB_MODE=offline) wrote, read back from its run-ID.wandb file: W&B's own protobuf
records, framed as a LevelDB log (32 KiB blocks; each piece a 7-byte header: CRC, length, type), after a 7-byte
file header. wandb ships no Python reader of its own for these files."""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@dataclass
class OfflineRun:
    """One offline-run-* directory: its W&B id, name, group, job type, config and history rows (key -> value)."""

    id: str = ""
    name: str = ""
    group: str = ""
    job_type: str = ""
    config: dict = field(default_factory=dict)
    rows: list[dict] = field(default_factory=list)

    def steps(self, prefix: str) -> list[int]:
        """The W&B steps of the rows holding a metric whose name starts with ``prefix``."""
        return [r["_step"] for r in self.rows if any(k.startswith(prefix) for k in r)]


def records(path: Path) -> list:
    """The protobuf Records of one .wandb file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, piece, found = HEADER, b"", []
    while pos + HEADER <= len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's tail too short for a header is padding
            pos += BLOCK - pos % BLOCK
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0:
            break
        piece += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(piece)
            found.append(record)
            piece = b""
    return found


def finished_records(path: Path, timeout_s: float = 60) -> list:
    """The records of a finished run's file: W&B's service may still be writing it after ``finish()`` returns (seen:
    the file held only its header then), so wait for its last record, ``exit``."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = records(path)
        if any(r.WhichOneof("record_type") == "exit" for r in found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def read_offline_run(directory: Path) -> OfflineRun:
    """The finished run in ``directory`` (RUN/wandb/offline-run-*): its records merged as W&B's sync would."""
    run = OfflineRun()
    for record in finished_records(next(directory.glob("run-*.wandb"))):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            r = record.run
            run.id, run.name, run.group, run.job_type = r.run_id, r.display_name, r.run_group, r.job_type
            run.config.update({i.key: json.loads(i.value_json) for i in r.config.update})
        elif kind == "config":
            run.config.update({i.key: json.loads(i.value_json) for i in record.config.update})
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item}
            run.rows.append(row)
    return run


def offline_runs(run_dir: Path) -> list[OfflineRun]:
    """Every offline W&B run under ``run_dir`` (its wandb/ folder and its sub-runs'), oldest first."""
    return [read_offline_run(d) for d in sorted(Path(run_dir).rglob("offline-run-*"), key=lambda d: d.name)]
