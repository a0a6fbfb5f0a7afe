"""Parquet query sources of the baseline's pipeline: the Hub's parquet export (bookcorpus) and local parquet files.

bookcorpus is read from the Hub's parquet export (refs/convert/parquet), whose file list and parquet footers are
read first: a partial, missing or resized export ends in one line before the download. A local .parquet file or
folder gives the split the run asks for, its text column chosen by --task.query-column; a folder's files are told
apart by the Hugging Face layouts (docs/data-sources.md).
"""

from __future__ import annotations

import os
import re
from pathlib import Path, PurePosixPath
from typing import Iterable, Sequence

from huggingface_hub import constants

from lm_human_preference_details.queries.columns import check_row_count, parquet_rows
from lm_human_preference_details.queries.columns import reason as _reason
from lm_human_preference_details.queries.source import ParquetExport
from lm_human_preference_details.utils import downloads
from lm_human_preference_details.utils.errors import UserError

# OAI fork lm_human_preferences/oaidatasets/books.py: load_dataset("bookcorpus", split=mode), data["text"]
BOOKCORPUS = ParquetExport("bookcorpus/bookcorpus", "plain_text", "text", 74_004_228)
PARQUET_REVISION = "refs/convert/parquet"  # the Hub's parquet export; bookcorpus's old loading script no longer runs
# a split's name in the Hugging Face layouts: a folder ({config}/{split}/0000.parquet) or a file name's start
# ({split}-00000-of-00002.parquet, {split}.parquet); the converter's `partial-{split}` holds a split's first rows only
SPLIT_NAME = r"(?:partial-)?(?:train|test|validation|valid|val|dev)"


def hub_offline() -> bool:
    """Whether only the Hugging Face cache may be read: HF_HUB_OFFLINE=1, or a Hub that does not answer at all."""
    return bool(constants.HF_HUB_OFFLINE) or not downloads.hub_reachable()


# ------------------------------------------------------------------------- the Hub's parquet exports (bookcorpus)
def export_train_files(source: ParquetExport, paths: Iterable[str]) -> list[str]:
    """The train split's files among ``paths`` (paths inside ``source``'s parquet export), in row order; a one-line
    UserError when the export has no full train split."""
    # huggingface/dataset-viewer: a dataset over max_dataset_size_bytes (5 GB) is converted only in part, into a
    # `partial-{split}` folder holding its first rows
    paths = [PurePosixPath(p) for p in paths if p.endswith(".parquet")]
    train = sorted(str(p) for p in paths if p.parent == PurePosixPath(source.config, "train"))
    if train:
        return train
    partial = any(p.parent == PurePosixPath(source.config, "partial-train") for p in paths)
    holds = ("only a partial train split (partial-train/, the first rows the Hub's converter kept)" if partial
             else "no train split")
    raise UserError(f"the Hub's parquet export of {source.repo_id} ({PARQUET_REVISION}) holds {holds}, so the "
                    f"baseline's shuffle over all {source.num_rows:,} rows cannot be reproduced; {_local_fix(source)}")


def _local_fix(source: ParquetExport) -> str:
    return (f"pass --task.query-dataset a local .parquet file or folder holding the whole train split "
            f"({source.num_rows:,} rows, column {source.column!r}, in the dataset's order)")


def check_hub_export(source: ParquetExport) -> list[str]:
    """Before any download: the export's train files, listed by the Hub's API, and their rows, read from the parquet
    footers by range requests; one line for a partial, missing or resized export. Returns the files to download."""
    # huggingface_hub's API takes about a second to import: only a download pays it
    from huggingface_hub import HfApi, HfFileSystem
    from huggingface_hub.utils import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        tree = HfApi().list_repo_tree(source.repo_id, path_in_repo=source.config, recursive=True, repo_type="dataset",
                                      revision=PARQUET_REVISION)
        sizes = {entry.path: entry.size for entry in tree if getattr(entry, "size", None) is not None}
    except (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError) as e:
        raise UserError(f"the Hub has no parquet export of {source.repo_id} ({PARQUET_REVISION}/{source.config}: "
                        f"{_reason(e)}); {_local_fix(source)}") from None
    except Exception as e:  # an outage or a network error: HF_HUB_OFFLINE=1 reads the cache instead (the advice)
        raise UserError(f"cannot list the Hub's parquet export of {source.repo_id} ({_reason(e)}); "
                        f"{_hub_advice(source)}") from None
    train = export_train_files(source, sizes)
    fs, rows = HfFileSystem(), 0
    for path in train:
        try:
            with fs.open(f"datasets/{source.repo_id}/{path}", "rb", revision=PARQUET_REVISION) as f:
                rows += parquet_rows(f)
        except Exception as e:
            raise UserError(f"cannot read the parquet footer of {source.repo_id}/{path} ({_reason(e)}); "
                            f"{_hub_advice(source)}") from None
    check_row_count(f"the Hub's parquet export of {source.repo_id}", rows, source.num_rows,
                    f"the export has changed since the baseline ran; {_local_fix(source)}")
    print(f"downloading the parquet export of {source.repo_id} once: {len(train)} files, "
          f"{sum(sizes[p] for p in train) / 1e9:.2f} GB, {rows:,} rows")
    return train


def _hub_advice(source: ParquetExport) -> str:
    return (f"download it on a machine with internet (`hf download {source.repo_id} --repo-type dataset --revision "
            f"{PARQUET_REVISION} --include '{source.config}/train/*.parquet'`) and run with HF_HUB_OFFLINE=1, "
            f"or {_local_fix(source)}")


def export_files(source: ParquetExport, *, hub_cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """The train files of ``source``'s parquet export in the Hugging Face cache, checked (`check_hub_export`) and
    downloaded once; with HF_HUB_OFFLINE=1 (or no Hub) the cached copy, checked the same way from its own footers."""
    # huggingface_hub's API takes about a second to import: only a download pays it
    from huggingface_hub import snapshot_download

    offline = hub_offline()
    patterns = None if offline else check_hub_export(source)  # exactly the checked files
    try:
        root = Path(snapshot_download(source.repo_id, repo_type="dataset", revision=PARQUET_REVISION,
                                      allow_patterns=patterns, cache_dir=hub_cache_dir, local_files_only=offline))
    except Exception as e:  # offline without a cached copy, or a network error mid-download
        raise UserError(f"cannot get the {source.repo_id.split('/')[-1]} dataset ({source.repo_id}, parquet export) "
                        f"from the Hugging Face Hub ({_reason(e)}); {_hub_advice(source)}") from None
    train = [root / p for p in export_train_files(source, (p.relative_to(root).as_posix() for p in root.rglob("*.parquet")))]
    check_row_count(f"the cached parquet export of {source.repo_id} ({train[0].parent})",
                    sum(parquet_rows(f) for f in train), source.num_rows,
                    f"delete it from the Hugging Face cache (`hf cache rm dataset/{source.repo_id}`) to download it "
                    f"again, or {_local_fix(source)}")
    return train


# ---------------------------------------------------------------------------------------------- local parquet
def is_parquet(path: Path) -> bool:
    """Whether a local parquet source's path (a .parquet name, or a folder of them: `registry.query_source`) is there:
    a file, or a folder holding .parquet files."""
    return path.is_file() or (path.is_dir() and any(path.rglob("*.parquet")))


def split_of(relative: PurePosixPath) -> str | None:
    """The split a parquet file of a local folder belongs to (its path relative to the folder): the innermost folder
    named like a split, else a file name starting with one, else None."""
    for name in reversed(relative.parent.parts):
        if re.fullmatch(SPLIT_NAME, name):
            return name
    match = re.match(rf"({SPLIT_NAME})(?=[-_.])", relative.name)
    return match.group(1) if match else None


def local_parquet_files(path: Path, split: str = "train") -> list[Path]:
    """The files of a local .parquet file or folder that hold ``split``, in row order (sorted names). A folder's
    files are told apart by `split_of`; mixed splits and files of different schemas end in one line."""
    # pyarrow takes about a second to import: only a run that reads parquet pays it
    import pyarrow.parquet as pq

    if path.is_file():
        files = [path]
    else:
        by_split: dict[str | None, list[Path]] = {}
        for f in sorted(path.rglob("*.parquet")):
            by_split.setdefault(split_of(PurePosixPath(f.relative_to(path).as_posix())), []).append(f)
        named = sorted(s for s in by_split if s is not None)
        if None in by_split and named:
            raise UserError(f"query dataset {path} mixes files of the splits {', '.join(named)} with files of no split "
                            f"(e.g. {by_split[None][0]}); pass the folder of the {split} split alone")
        if split in by_split and f"partial-{split}" in by_split:
            raise UserError(f"query dataset {path} holds both a {split} and a partial-{split} split; pass the folder "
                            f"of the {split} split alone")
        if named and split not in by_split:
            partial = f" (partial-{split} holds only the first rows of a split)" if f"partial-{split}" in by_split else ""
            raise UserError(f"query dataset {path} holds the splits {', '.join(named)} but no {split} split{partial}; "
                            f"pass a folder holding the whole {split} split")
        files = by_split.get(split if named else None, [])
        folders = sorted({str(f.parent) for f in files})
        if len(folders) > 1:
            raise UserError(f"query dataset {path}: its {split} files lie in {len(folders)} folders ({', '.join(folders)}),"
                            " so their order is not one dataset's; pass one of these folders")
    schemas = []
    for f in files:
        try:
            schemas.append(pq.read_schema(f).remove_metadata())
        except Exception as e:  # not a parquet file
            raise UserError(f"cannot read {f} as parquet ({_reason(e)})") from None
    for f, schema in zip(files, schemas):
        if not schema.equals(schemas[0]):
            raise UserError(f"query dataset {path} holds files of different schemas ({files[0].name}: "
                            f"{_columns(schemas[0])}; {f.name}: {_columns(schema)}); pass a folder of one dataset's split")
    return files


def _columns(schema) -> str:
    return ", ".join(f"{name} {type_}" for name, type_ in zip(schema.names, schema.types))


def check_parquet_column(files: Sequence[Path], column: str) -> None:
    """A one-line UserError unless the parquet ``files`` (of one schema) have a string column ``column``."""
    # pyarrow takes about a second to import: only a run that reads parquet pays it
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pq.read_schema(files[0])
    if column not in schema.names:
        raise UserError(f"query dataset {files[0]} has no column {column!r} (columns: {', '.join(schema.names)}); "
                        "pass its text column with --task.query-column")
    type_ = schema.field(column).type
    if not (pa.types.is_string(type_) or pa.types.is_large_string(type_)):
        raise UserError(f"query dataset {files[0]}: column {column!r} holds {type_}, not text; pass its text column "
                        "with --task.query-column")


def first_row_without_text(files: Sequence[Path], column: str) -> tuple[int, str] | None:
    """The first row of the parquet ``files`` (in order) whose ``column`` is null or an empty text, and which of the
    two; None when every row holds text. Reads that one column, a batch at a time."""
    # pyarrow takes about a second to import: only a run that reads parquet pays it
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    offset = 0
    for f in files:
        for batch in pq.ParquetFile(f).iter_batches(columns=[column], batch_size=65536):
            values = batch.column(0)
            bad = pc.or_kleene(pc.is_null(values), pc.equal(pc.utf8_length(values), 0)).fill_null(True)
            if pc.any(bad).as_py():
                i = pc.index(bad, True).as_py()
                return offset + i, "null" if values[i].as_py() is None else "an empty text"
            offset += len(values)
    return None

