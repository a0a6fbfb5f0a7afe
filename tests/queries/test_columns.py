"""queries/columns.py: a memory-mapped text column and the row-count check that says a source is the baseline's."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lm_human_preference_details.queries.columns import TextColumn, check_row_count, parquet_rows, reason
from lm_human_preference_details.utils.errors import UserError


def test_row_count_and_reason_by_hand():
    check_row_count("f.parquet", 5, None, "fix")  # no count to hold it to
    check_row_count("f.parquet", 74_004_228, 74_004_228, "fix")
    for rows in (1234, 74_004_229):  # fewer or more: either is another stream
        with pytest.raises(UserError) as e:
            check_row_count("f.parquet", rows, 74_004_228, "pass the whole export")
        assert str(e.value) == (f"f.parquet holds {rows:,} rows, the baseline shuffled 74,004,228, so its stream would "
                                "not be the baseline's; pass the whole export")
    assert reason(ValueError("first line\nsecond line")) == "first line"
    assert reason(KeyError()) == "KeyError" and reason(OSError("  \n")) == "OSError"  # no message: its type


def test_a_text_column_gives_the_rows_asked_in_their_order_and_strings_only(tmp_path):
    path = tmp_path / "posts.parquet"
    pq.write_table(pa.table({"text": ["zero", "one", None, "three", "four"], "n": [0, 1, 2, 3, 4]}), path)
    assert parquet_rows(path) == 5  # from the footer
    column = TextColumn.from_parquet([path], "text", cache_dir=tmp_path / "ds-cache")
    assert len(column) == 5 and column.table.column_names == ["text"]  # the other columns are not kept
    assert column.texts(np.array([3, 0, 4, 0])) == ["three", "zero", "four", "zero"]
    with pytest.raises(UserError, match=re.escape(f"query dataset {path}: row 2 of column 'text' is None, not a string")):
        column.texts(np.array([1, 2]))
    (tmp_path / "notes.parquet").write_text("not parquet")
    with pytest.raises(UserError, match=r"cannot read .*notes.parquet as parquet \("):
        TextColumn.from_parquet([tmp_path / "notes.parquet"], "text", cache_dir=tmp_path / "ds-cache")
    (tmp_path / "damaged.arrow").write_bytes(b"\x00" * 16)
    with pytest.raises(UserError, match=r"cannot read .*damaged.arrow \(.*\); delete it to build it again"):
        TextColumn.from_arrow(tmp_path / "damaged.arrow", "text")
