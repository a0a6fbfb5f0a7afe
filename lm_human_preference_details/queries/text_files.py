"""Local query files of the 2019 pipeline: a .jsonl (a JSON string or {"text": ...} per line) or a .txt (passages
split by blank lines), read once per process as UTF-8 and shuffled once like the original's datasets."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Iterator

from lm_human_preference_details.queries.streams import seeded_shuffle
from lm_human_preference_details.utils.errors import UserError


def read_local_texts(path: str | os.PathLike) -> list[str]:
    """Texts of a local .jsonl (a JSON string or {"text": ...} per line) or .txt (passages split by blank lines), read
    from disk once per process (check_query_dataset reads them before the run)."""
    path = Path(path)
    stat = path.stat() if path.is_file() else None
    return _read_local_texts(path, stat and (stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=4)
def _read_local_texts(path: Path, version: tuple[int, int] | None) -> list[str]:
    if version is None:
        raise UserError(f"query dataset {path} does not exist; pass an existing .jsonl/.txt/.parquet file or folder, "
                        "or a name --task.query-dataset takes (--help)")
    if path.suffix not in (".txt", ".jsonl"):
        raise UserError(f"query dataset {path}: unknown file type '{path.suffix}'; use .jsonl, .txt or .parquet")
    try:
        return _read_txt(path) if path.suffix == ".txt" else _read_jsonl(path)
    except UnicodeDecodeError:
        raise UserError(not_utf8(path)) from None


def _read_txt(path: Path) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", path.read_text(encoding="utf-8")) if p.strip()]


def _read_jsonl(path: Path) -> list[str]:
    texts = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"query dataset {path}, line {i}: not valid JSON ({e.msg})") from None
            if isinstance(value, dict):
                value = value.get("text")
            if not isinstance(value, str):
                raise UserError(f"query dataset {path}, line {i}: expected a JSON string or an object with a "
                                "string 'text' field")
            texts.append(value)
    return texts


def local_texts(path: str | os.PathLike, mode: str, seed: int = 0) -> Iterator[str]:
    """A local query file, shuffled once like the original's datasets; the same file serves every mode."""
    yield from seeded_shuffle(read_local_texts(path), seed)


def not_utf8(path: Path) -> str:
    """The one line that says where ``path`` stops being UTF-8: its line and byte, and the fix."""
    data = path.read_bytes()
    try:
        data.decode("utf-8")
        return f"query dataset {path} is not UTF-8 text; save it as UTF-8"
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        return (f"query dataset {path} is not UTF-8 text: line {line}, byte {e.start} ({data[e.start:e.start + 1]!r}) "
                f"{e.reason}; save the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)")

