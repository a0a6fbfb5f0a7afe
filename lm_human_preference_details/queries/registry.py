"""The names `--task.query-dataset` takes, and what a local path means: the one place a value's kind is decided.

As in the original's datasets.py, a source is a function (or a class) and a line: `SOURCES[name] = ...` for a name,
`FILE_TYPES[suffix] = ...` for a local file. `query_source` turns a value into its `QuerySource` once (its one
caller: `tasks.TaskHParams.source`); every other place reads that value. `check_query_dataset` checks a run's flags
against it before anything is written.
Adding a source: docs/data-sources.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

from lm_human_preference_details.language.tokenizer import encode_plain, load_tokenizer, single_token
from lm_human_preference_details.queries.batches import empty_text, process_query
from lm_human_preference_details.queries.columns import TextColumn, check_row_count
from lm_human_preference_details.queries.hub import (
    BOOKCORPUS,
    check_parquet_column,
    export_files,
    first_row_without_text,
    is_parquet,
    local_parquet_files,
)
from lm_human_preference_details.queries.oai2019 import (
    books_texts,
    check_label_queries,
    cnndm_texts,
    label_queries,
    tldr_texts,
)
from lm_human_preference_details.queries.samplers import ColumnSource, TextSource
from lm_human_preference_details.queries.source import QuerySource, Request
from lm_human_preference_details.queries.text_files import local_texts, read_local_texts
from lm_human_preference_details.queries.tldr17 import TLDR, TLDR_FIELDS, read_hub_archive, read_local_archive
from lm_human_preference_details.utils.errors import UserError


def read_parquet(source: ColumnSource, column: str, *, cache_dir: str | os.PathLike | None = None,
                 hub_cache_dir: str | os.PathLike | None = None, datasets_cache_dir: str | os.PathLike | None = None
                 ) -> TextColumn:
    """The text column of a parquet source (the Hub's export, or local files), its rows counted where known."""
    files = parquet_files(source, hub_cache_dir=hub_cache_dir)
    check_parquet_column(files, column)
    data = TextColumn.from_parquet(files, column, cache_dir=datasets_cache_dir)
    check_row_count(data.name, len(data), source.num_rows, "delete it from the Hugging Face cache to download it again")
    return data


def read_text_file(request: Request) -> Iterator[str]:
    """The texts of a local .jsonl/.txt query file, shuffled once with the request's seed; a missing file is one line
    at once."""
    if not request.source.path.is_file():
        raise UserError(unknown_dataset(request.source.name))
    return local_texts(request.source.path, request.mode, request.seed)


# --------------------------------------------------------------------------------------------- the registry
SOURCES: dict[str, QuerySource] = {
    # the public baseline's, shuffled per rank: OAI fork lm_human_preferences/oaidatasets/books.py, tldr.py
    "bookcorpus": ColumnSource(read=read_parquet, hub=BOOKCORPUS, column=BOOKCORPUS.column, fields=(BOOKCORPUS.column,),
                               num_rows=BOOKCORPUS.num_rows),
    "tldr-17": ColumnSource(read=read_hub_archive, hub=TLDR, column=TLDR.column, fields=TLDR_FIELDS, num_rows=TLDR.num_rows),
    # OpenAI's 2019 pipeline: OAI lm_human_preferences/datasets/books.py, tldr.py, cnndm.py; launch.py's start/end
    "books-2019": TextSource(items=lambda r: books_texts(r.mode, r.seed, query_length=r.query_length),
                             start_text=".", end_text="."),
    "tldr-2019": TextSource(items=lambda r: tldr_texts(r.mode, r.seed), references=True),
    "cnndm": TextSource(items=lambda r: cnndm_texts(r.mode, r.seed), references=True),
    "oai-label-queries": TextSource(items=lambda r: label_queries(r.labels_source, query_length=r.query_length,
                                                                  pad_id=r.pad_id, seed=r.seed),
                                    check=check_label_queries, needs_labels=True),
}


def hub_datasets(hparams: dict) -> list[str]:
    """The Hugging Face Hub datasets a run's queries came from (its task's --task.query-dataset, a named source read
    from the Hub), for a saved model's card; [] for a local file or OpenAI's 2019 files."""
    name = (hparams.get("task") or {}).get("query_dataset")
    hub = getattr(SOURCES.get(name), "hub", None) if isinstance(name, str) else None
    return [hub.repo_id] if hub is not None else []


def check_file(request: Request) -> None:
    """A local file the run reads once it starts (a .zip copy of tldr-17's corpus): it exists."""
    if not request.source.path.is_file():
        raise UserError(unknown_dataset(request.source.name))


def check_local_parquet(request: Request) -> None:
    """A local parquet file or folder: its train files, their schema and text column, and a text in every row."""
    files = parquet_files(request.source)
    check_parquet_column(files, request.column)
    found = first_row_without_text(files, request.column)
    if found is not None:
        row, what = found
        where = f"query dataset {request.source.name}: row {row} of column {request.column!r}"
        fix = "drop that row or pass another --task.query-column"
        raise UserError(empty_text(where, fix) if what == "an empty text" else f"{where} is null, not a text; {fix}")


def check_text_file(request: Request) -> None:
    """A local .jsonl/.txt query file: it exists, reads as UTF-8 in its format, and gives at least one usable query
    (FIDELITY A4 query processing) with the run's start and end text; an empty text that would be a query is refused,
    naming it."""
    source = request.source
    if not source.path.is_file():
        raise UserError(unknown_dataset(source.name))
    texts = read_local_texts(source.path)
    if not texts:
        raise UserError(f"--task.query-dataset {source.name} holds no texts; pass a file with at least one")
    if request.start_text is None and request.end_text is None:
        empty = next((i for i, text in enumerate(texts, 1) if not text), None)
        if empty is not None:
            raise UserError(empty_text(f"text {empty} of query dataset {source.name} (blank lines not counted)",
                                       "drop it, or set --task.start-text or --task.end-text so that it is skipped"))
    elif request.base_model is not None and not has_usable_query(request, texts):
        raise UserError(f"--task.query-dataset {source.name} gives no usable query: every text lacks the start text "
                        f"{request.start_text!r} or, within its first {request.query_length} tokens, the end text "
                        f"{request.end_text!r}; check --task.start-text / --task.end-text")


def has_usable_query(request: Request, texts: list[str]) -> bool:
    """Whether a text of ``texts`` survives the run's query processing (A4 query processing), encoded with the base
    model's tokenizer; stops at the first that does."""
    tokenizer = load_tokenizer(request.base_model)
    start = None if request.start_text is None else single_token(tokenizer, request.start_text, "--task.start-text")
    end = None if request.end_text is None else single_token(tokenizer, request.end_text, "--task.end-text")
    for text in texts:
        (tokens,) = encode_plain(tokenizer, [text])
        if process_query(tokens, query_length=request.query_length, start_token=start, end_token=end,
                         pad_id=tokenizer.pad_token_id) is not None:
            return True
    return False


# a local path, by its suffix; a folder holding .parquet files reads as ".parquet"
FILE_TYPES: dict[str, QuerySource] = {
    ".parquet": ColumnSource(read=read_parquet, check=check_local_parquet),
    ".zip": ColumnSource(read=read_local_archive, column=TLDR.column, fields=TLDR_FIELDS, check=check_file),
    # OAI launch.py books_task: start_text = end_text = '.' for OpenAI's book passages, the rule a local file of
    # passages follows too
    ".jsonl": TextSource(items=read_text_file, start_text=".", end_text=".", check=check_text_file),
    ".txt": TextSource(items=read_text_file, start_text=".", end_text=".", check=check_text_file),
}
OTHER_FILE = TextSource(items=read_text_file, check=check_text_file)  # checked, and refused, as a query file


# ------------------------------------------------------------------------------------------- deciding once
def query_source(dataset: str) -> QuerySource:
    """What ``dataset`` (a --task.query-dataset value) names: a registered source, else a local file or folder by its
    suffix (~ expanded); any other path is read as a query file, whose check says what is wrong with it."""
    if dataset in SOURCES:
        return SOURCES[dataset].at(dataset)
    path = Path(dataset).expanduser()
    kind = FILE_TYPES.get(path.suffix)
    if kind is None and path.is_dir() and any(path.rglob("*.parquet")):
        kind = FILE_TYPES[".parquet"]  # a folder of parquet files: one split of one dataset
    return (kind or OTHER_FILE).at(dataset, path)


def unknown_dataset(name: str) -> str:
    """The one line for a value that names no source."""
    return (f"unknown query dataset {name!r}: --task.query-dataset {name} is neither one of {', '.join(SOURCES)} nor "
            "an existing .jsonl/.txt/.parquet/.zip file or folder of .parquet files; pass one of them")


def not_parquet(name: str) -> str:
    """The one line for a value that names no parquet source of the baseline's pipeline."""
    baseline = [n for n, source in SOURCES.items() if source.shuffled_per_rank]
    return (f"query dataset {name!r} is neither {' nor '.join(baseline)} nor an existing .parquet file or folder of "
            ".parquet files (nor a .zip copy of tldr-17's corpus)")


def parquet_files(source: QuerySource, *, split: str = "train",
                  hub_cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """The parquet files of ``source`` in row order: a local .parquet file or folder (its ``split``), or the Hub's
    parquet export of a registered source, checked and downloaded once (HF_HUB_OFFLINE=1 reuses it)."""
    if source.path is None:  # a registered name: the Hub's parquet export
        return export_files(source.hub, hub_cache_dir=hub_cache_dir)
    if not is_parquet(source.path):
        raise UserError(not_parquet(source.name))
    return local_parquet_files(source.path, split)


def open_query_data(source: ColumnSource, column: str, *, cache_dir: str | os.PathLike | None = None,
                    hub_cache_dir: str | os.PathLike | None = None,
                    datasets_cache_dir: str | os.PathLike | None = None) -> TextColumn:
    """The text column ``column`` of ``source`` (a source of the baseline's pipeline), every check done before
    anything large is read; rows counted where known."""
    source.check_column(column)
    return source.read(source, column, cache_dir=cache_dir, hub_cache_dir=hub_cache_dir,
                       datasets_cache_dir=datasets_cache_dir)


def check_query_dataset(source: QuerySource, *, query_length: int, labels_source: str | None, column: str = "text",
                        start_text: str | None = None, end_text: str | None = None,
                        base_model: str | None = None) -> None:
    """--task.query-dataset read as the run will read it, before anything is written: a registered name, a local
    .jsonl/.txt file of texts (with ``base_model``: one usable query at least), a .parquet file or folder with a text
    ``column``, a .zip copy of tldr-17's corpus; for oai-label-queries, the label file's queries (when it is on disk).
    The source's own checks first (`QuerySource.check_request`: a baseline source's fields, or the tldr-17 archive's),
    then those of what it reads (`QuerySource.check`)."""
    request = Request(source, query_length=query_length, labels_source=labels_source, column=column,
                      start_text=start_text, end_text=end_text, base_model=base_model)
    source.check_request(request)
    if source.check is not None:
        source.check(request)
