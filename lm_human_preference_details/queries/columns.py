"""A text column of the baseline's sources, memory-mapped, and the row-count checks that say it is the baseline's.

The Hub's parquet exports, local parquet files and tldr-17's table all end as a `TextColumn`: one string column of an
Arrow table that `datasets` memory-maps, so only the rows a batch asks for are read.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import numpy as np

from lm_human_preference_details.utils.errors import UserError


def reason(e: BaseException) -> str:
    """The first line of an exception's message (its type when it has none), for a one-line error."""
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def check_row_count(where: str, rows: int, expected: int | None, fix: str) -> None:
    """A one-line UserError when ``where`` holds another number of rows than the baseline shuffled."""
    if expected is not None and rows != expected:
        raise UserError(f"{where} holds {rows:,} rows, the baseline shuffled {expected:,}, so its stream would not be the "
                        f"baseline's; {fix}")


def parquet_rows(file) -> int:
    """Rows of a parquet file (a path or an open file), read from its footer alone."""
    # pyarrow takes about a second to import: only a run that reads parquet pays it
    import pyarrow.parquet as pq

    return pq.ParquetFile(file).metadata.num_rows


class TextColumn:
    """One string column of a memory-mapped Arrow table (`datasets`' cache of parquet files, or our tldr-17 table)."""

    def __init__(self, table, column: str, name: str):
        self.table, self.column, self.name = table.select_columns([column]), column, name

    @classmethod
    def from_parquet(cls, files: Sequence[Path], column: str, *, cache_dir: str | os.PathLike | None = None) -> TextColumn:
        """The column of parquet ``files`` (one schema), converted once into `datasets`' Arrow cache."""
        # `datasets` takes seconds to import: only a run that reads a column pays it
        import datasets

        try:
            table = datasets.Dataset.from_parquet([str(f) for f in files], cache_dir=cache_dir)
        except Exception as e:  # an unreadable or non-parquet file
            raise UserError(f"cannot read {files[0]} as parquet ({reason(e)})") from None
        return cls(table, column, str(files[0] if len(files) == 1 else files[0].parent))

    @classmethod
    def from_arrow(cls, path: Path, column: str) -> TextColumn:
        """The column of an Arrow stream file (`tldr17.archive_table`), memory-mapped."""
        # `datasets` takes seconds to import: only a run that reads a column pays it
        import datasets

        try:
            return cls(datasets.Dataset.from_file(str(path)), column, str(path))
        except Exception as e:  # a damaged cache file
            raise UserError(f"cannot read {path} ({reason(e)}); delete it to build it again") from None

    def __len__(self) -> int:
        return len(self.table)

    def texts(self, rows: np.ndarray) -> list[str]:
        """The column's values at ``rows``, in that order."""
        values = self.table[[int(i) for i in rows]][self.column]
        for i, value in zip(rows, values):
            if not isinstance(value, str):
                raise UserError(f"query dataset {self.name}: row {int(i)} of column {self.column!r} is "
                                f"{value!r}, not a string")
        return values

