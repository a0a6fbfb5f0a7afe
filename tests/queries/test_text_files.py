"""queries/text_files.py: bad bytes, empty texts and files without a usable query end in one `error:` line naming the
place, before the run starts where the file can be read up front (nothing written), else when the row is drawn."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from helpers.assets import reward_args
from helpers.errors import assert_one_error_line
from helpers.queries import write_tldr_zip

from lm_human_preference_details.language.model import last_real_indices
from lm_human_preference_details.queries import QuerySampler, check_query_dataset, query_source
from lm_human_preference_details.queries.samplers import HFQuerySampler
from lm_human_preference_details.queries.text_files import read_local_texts
from lm_human_preference_details.utils.errors import UserError

LATIN1 = "Caf\u00e9 au lait. It was good.".encode("latin-1")  # byte 0xe9: not UTF-8


@pytest.fixture(scope="module")
def query_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("query-files")
    (d / "latin1.txt").write_bytes(b"A first passage. Fine.\n\n" + LATIN1 + b"\n")
    (d / "latin1.jsonl").write_bytes(b'"A first text. Fine."\n"' + LATIN1 + b'"\n')
    (d / "no-period.txt").write_text("no start token here\n\nnor in this one\n")
    (d / "empty.jsonl").write_text('"A text. Fine."\n\n""\n')
    pq.write_table(pa.table({"text": ["One row.", "Two rows.", "", "Four."]}), d / "empty-row.parquet")
    pq.write_table(pa.table({"text": ["One row.", None]}), d / "null-row.parquet")
    return d


def test_the_original_cannot_read_a_query_of_pads_only():
    """What an empty text becomes: a context whose first token is a pad, which the model refuses (FIDELITY B2)."""
    with pytest.raises(ValueError, match="starts with a pad token"):
        last_real_indices(torch.tensor([[False, False, False], [True, False, False]]))


@pytest.mark.parametrize("name, line", [("latin1.txt", 3), ("latin1.jsonl", 2)])
def test_a_file_that_is_not_utf8_is_one_line_naming_the_line_and_byte(query_files, name, line):
    path = query_files / name
    byte = path.read_bytes().index(b"\xe9")
    with pytest.raises(UserError, match=rf"is not UTF-8 text: line {line}, byte {byte} \(b'\\xe9'\).*save the file as "
                                        "UTF-8") as e:
        read_local_texts(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_an_empty_text_is_refused_up_front_naming_it(query_files):
    with pytest.raises(UserError, match=r"text 2 of query dataset .*empty.jsonl \(blank lines not counted\) is an empty "
                                        r"text, a query of pads only"):
        check_query_dataset(query_source(str(query_files / "empty.jsonl")), query_length=8, labels_source=None)
    # with a start or end text the original skips it (A4): nothing to refuse
    check_query_dataset(query_source(str(query_files / "empty.jsonl")), query_length=8, labels_source=None, start_text=".",
                        end_text=".")
    with pytest.raises(UserError, match=r"empty-row.parquet: row 2 of column 'text' is an empty text, a query of pads "
                                        r"only, which the original's model cannot read"):
        check_query_dataset(query_source(str(query_files / "empty-row.parquet")), query_length=8, labels_source=None)
    with pytest.raises(UserError, match=r"null-row.parquet: row 1 of column 'text' is null, not a text; drop that row"):
        check_query_dataset(query_source(str(query_files / "null-row.parquet")), query_length=8, labels_source=None)


def test_an_empty_text_drawn_is_one_line_naming_it(tokenizer, query_files, tmp_path):
    """Sources read only once the run has started stop at the row, as the original did, in one line."""
    lines = [json.dumps({"summary": "s", "content": "c", "body": body}).encode() for body in ("a body.", "")]
    archive = write_tldr_zip(tmp_path / "corpus-webis-tldr-17.zip", lines)
    sampler = HFQuerySampler(tokenizer, source=query_source(str(archive)), query_length=8, batch_size=2, seed=0, world_size=1,
                             cache_dir=tmp_path / "cache", datasets_cache_dir=tmp_path / "ds")
    with pytest.raises(UserError, match=r"row 1 of column 'body' is an empty text, a query of pads only") as e:
        next(sampler)  # both rows in the first batch
    assert "\n" not in str(e.value)
    texts = QuerySampler(tokenizer, source=query_source(str(query_files / "empty.jsonl")), query_length=8, start_text=None,
                         end_text=None, batch_size=2)
    with pytest.raises(UserError, match=r"a text of query dataset .*empty.jsonl \(train\) is an empty text"):
        next(texts)


CASES = {  # file (in query_files), the message
    "latin1-txt": ("latin1.txt", "latin1.txt is not UTF-8 text: line 3, byte"),
    "latin1-jsonl": ("latin1.jsonl", "latin1.jsonl is not UTF-8 text: line 2, byte"),
    "no-usable-query": ("no-period.txt", "no-period.txt gives no usable query: every text lacks the start text '.'"),
    "empty-text": ("empty-row.parquet", "row 2 of column 'text' is an empty text"),
}


def test_bad_query_files_are_refused_before_the_run_writes_anything(assets, query_files, tmp_path):
    """Each case as `python train_reward.py` ends on it, run in this process (helpers.processes.refused_in_process)."""
    from helpers.processes import refused_in_process

    (tmp_path / "cwd").mkdir()
    for key, (name, message) in CASES.items():
        argv = reward_args(assets, tmp_path / "out" / key) + ["--task.query-dataset", query_files / name]
        assert_one_error_line(refused_in_process("train_reward.py", argv, tmp_path / "cwd"), message, status=None,
                              out=tmp_path / "out" / key, cwd=tmp_path / "cwd")
