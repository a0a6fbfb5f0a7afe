"""The public baseline's query stream (FIDELITY A3): a Hugging Face dataset column, shuffled and sharded per rank.

The W&B baseline (openrlbenchmark/lm-human-preferences) ran OpenAI's TF code from the fork
vwxyzjn/lm-human-preferences, branch poetry, on 8 MPI ranks. Each rank r loaded the whole `train` split,
shuffled it with `datasets`' `Dataset.shuffle(seed + r * 100003)`, repeated it forever and kept the items
r, r + 8, r + 16, ... of that stream (`tf.data` `repeat()` then `shard(8, r)`), with no start/end-text
processing: tokens[:query_length], right-padded. `HFQuerySampler` emulates all ranks in one process: the
rank-r block of every batch is rank r's next batch_size / world_size queries.

Where the rows come from, checked before anything large is downloaded:
- bookcorpus: the Hub's parquet export (refs/convert/parquet), whose file list and parquet footers are read first;
  a partial, missing or resized export ends in one line before the download;
- tldr-17: the corpus archive data/corpus-webis-tldr-17.zip (or a local copy), read line by line as the dataset's
  loading script read it, its `body` (or another field) kept once in an Arrow file of our cache, row count checked;
- a local .parquet file or folder (the split the run asks for), text column chosen by --task.query-column.

Only row indices are computed here (one permutation per rank, of which a window is kept); the texts are read
from a memory-mapped Arrow file, so the 74M-row bookcorpus costs little memory.
"""

from __future__ import annotations

import io
import json
import os
import re
import zipfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np
import torch

from lm_human_preference_details import files as cache_files
from lm_human_preference_details.cli import UserError
from lm_human_preference_details.files import atomic_path
from lm_human_preference_details.ranks import rank_seed
from lm_human_preference_details.tokenizer import encode_plain

DEFAULT_WINDOW = 1 << 17  # rows kept per rank between reshuffles: a books run draws 1954 * 64 = 125,056 per rank


@dataclass(frozen=True)
class ParquetExport:
    """A dataset the baseline read with `load_dataset(name, split='train')`, read here from the Hub's parquet export."""

    repo_id: str
    config: str  # the export's folder: refs/convert/parquet/{config}/train/*.parquet
    column: str  # the field the fork's generator yields
    num_rows: int  # rows of the train split the baseline shuffled (the script-built dataset's dataset_infos.json)


@dataclass(frozen=True)
class CorpusArchive:
    """A dataset whose loading script the baseline ran over an archive: the archive, read here as the script read it."""

    repo_id: str
    filename: str  # the archive in the dataset repo
    revision: str
    member: str  # the JSON-lines file inside the archive
    column: str  # the field the fork's generator yields
    num_rows: int  # rows the loading script yields from the whole corpus (its dataset_infos.json)


HF_SOURCES: dict[str, ParquetExport | CorpusArchive] = {
    # OAI fork lm_human_preferences/oaidatasets/books.py: load_dataset("bookcorpus", split=mode), data["text"]
    "bookcorpus": ParquetExport("bookcorpus/bookcorpus", "plain_text", "text", 74_004_228),
    # OAI fork lm_human_preferences/oaidatasets/tldr.py: load_dataset("webis/tldr-17", split=mode), data["body"];
    # the repo's data/ holds the corpus archive of Zenodo record 1043504, which the loading script read
    "tldr-17": CorpusArchive("webis/tldr-17", "data/corpus-webis-tldr-17.zip", "main", "corpus-webis-tldr-17.json",
                             "body", 3_848_330),
}
PARQUET_REVISION = "refs/convert/parquet"  # the Hub's parquet export; bookcorpus's old loading script no longer runs
TLDR = HF_SOURCES["tldr-17"]
# the string fields of each tldr-17 row (huggingface/datasets datasets/reddit/reddit.py: _ADDITIONAL_FEATURES + the two)
TLDR_FIELDS = ("author", "body", "normalizedBody", "subreddit", "subreddit_id", "id", "content", "summary")
# a split's name in the Hugging Face layouts: a folder ({config}/{split}/0000.parquet) or a file name's start
# ({split}-00000-of-00002.parquet, {split}.parquet); the converter's `partial-{split}` holds a split's first rows only
SPLIT_NAME = r"(?:partial-)?(?:train|test|validation|valid|val|dev)"


# ------------------------------------------------------------------------------------------ shuffle and shard
def shuffled_order(num_rows: int, seed: int) -> np.ndarray:
    """Row order of `datasets.Dataset.shuffle(seed=seed)` on ``num_rows`` rows: [num_rows] int32 (int64 if large)."""
    # datasets arrow_dataset.py Dataset.shuffle: np.random.default_rng(seed).permutation(len(self)), the same
    # rule from datasets 1.0 to 5.x; numpy's permutation(n) shuffles arange(n) by Fisher-Yates and draws the
    # same numbers whatever the item size, so an int32 arange gives the same order in half the memory
    dtype = np.int32 if num_rows <= np.iinfo(np.int32).max else np.int64
    order = np.arange(num_rows, dtype=dtype)
    np.random.default_rng(seed).shuffle(order)
    return order


def shard_rows(order: np.ndarray, *, rank: int, world_size: int, start: int, count: int) -> np.ndarray:
    """Rows of items start..start+count-1 of rank ``rank``'s shard of ``order`` repeated forever: [count]."""
    # OAI fork lm_human_preferences/language/datasets.py: Dataset.tf_dataset, repeat() then shard(num_shards, rank);
    # item k of the shard is item rank + k * world_size of the repeated stream
    positions = rank + world_size * np.arange(start, start + count, dtype=np.int64)
    return order[positions % len(order)]


class RankStream:
    """Row indices of one emulated rank's query stream, in order; keeps a window of them, recomputed on demand."""

    def __init__(self, num_rows: int, *, seed: int, rank: int, world_size: int, window: int = DEFAULT_WINDOW,
                 cache_dir: str | os.PathLike | None = None):
        if num_rows < 1:
            raise UserError("the query dataset has no rows")
        self.num_rows, self.rank, self.world_size, self.window = num_rows, rank, world_size, max(window, 1)
        # E9 per-rank seeds: OAI fork lm_human_preferences/train_policy.py, train_reward.py: train (commit 64f402b),
        # the dataset shuffled with seed = run.seed + rank * 100003, the rank's own seed
        self.seed = rank_seed(seed, rank)
        # the first window depends on nothing else, and a shuffle of 74M rows takes seconds per rank: cache it
        self._cache = Path(cache_dir or cache_files.CACHE_DIR, "hf_queries",
                           f"rows{num_rows}-seed{self.seed}-rank{rank}of{world_size}-first{self.window}.npy")
        self._rows = np.empty(0, dtype=np.int64)
        self._start = 0  # shard index of self._rows[0]
        self.consumed = 0  # shard items handed out so far

    def _load(self, start: int, count: int) -> np.ndarray:
        first_window = start == 0 and count == self.window
        if first_window and self._cache.is_file():
            try:
                rows = np.load(self._cache)
                if rows.shape == (count,):
                    return rows
            except (OSError, ValueError):  # an unreadable cache file is recomputed and replaced
                pass
        order = shuffled_order(self.num_rows, self.seed)
        rows = shard_rows(order, rank=self.rank, world_size=self.world_size, start=start, count=count)
        if first_window:
            try:
                with atomic_path(self._cache) as tmp, open(tmp, "wb") as f:
                    np.save(f, rows)
            except OSError:  # a read-only cache only costs the next run the shuffle again
                pass
        return rows

    def first_row(self) -> int:
        """The row of this rank's first item, whatever has been taken (from the cached first window)."""
        return int(self._load(0, self.window)[0])

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` row indices of this rank's stream: [count]."""
        end = self.consumed + count
        if end > self._start + len(self._rows):
            self._start = self.consumed
            self._rows = self._load(self.consumed, max(self.window, count))
        rows = self._rows[self.consumed - self._start : end - self._start]
        self.consumed = end
        return rows


# ---------------------------------------------------------------------------------------------- checks
def _reason(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def hub_offline() -> bool:
    """Whether only the Hugging Face cache may be read: HF_HUB_OFFLINE=1, or a Hub that does not answer at all."""
    from huggingface_hub import constants

    from lm_human_preference_details.downloads import hub_reachable

    return bool(constants.HF_HUB_OFFLINE) or not hub_reachable()


def is_archive(dataset: str) -> bool:
    """A local copy of tldr-17's corpus archive (a .zip path) rather than a parquet file or folder."""
    return Path(dataset).suffix == ".zip"


def check_query_column(dataset: str, column: str) -> None:
    """A one-line UserError when ``column`` cannot be a text column of ``dataset`` (a local parquet's columns are
    checked once its files are found, `parquet_files`)."""
    source = HF_SOURCES.get(dataset)
    if isinstance(source, CorpusArchive) or (source is None and is_archive(dataset)):
        fields = TLDR_FIELDS
    elif source is not None:
        fields = (source.column,)
    else:
        return
    if column not in fields:
        baseline = (source or TLDR).column
        raise UserError(f"--task.query-column {column!r} is not a field of {dataset} (its fields: {', '.join(fields)}); "
                        f"the baseline read {baseline!r}: pass --task.query-column {baseline}")


def check_row_count(where: str, rows: int, expected: int | None, fix: str) -> None:
    """A one-line UserError when ``where`` holds another number of rows than the baseline shuffled."""
    if expected is not None and rows != expected:
        raise UserError(f"{where} holds {rows:,} rows, the baseline shuffled {expected:,}, so its stream would not be the "
                        f"baseline's; {fix}")


def parquet_rows(file) -> int:
    """Rows of a parquet file (a path or an open file), read from its footer alone."""
    import pyarrow.parquet as pq

    return pq.ParquetFile(file).metadata.num_rows


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


def hub_export_files(dataset: str, *, hub_cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """The train files of ``dataset``'s parquet export in the Hugging Face cache, checked (`check_hub_export`) and
    downloaded once; with HF_HUB_OFFLINE=1 (or no Hub) the cached copy, checked the same way from its own footers."""
    from huggingface_hub import snapshot_download

    source = HF_SOURCES[dataset]
    offline = hub_offline()
    patterns = None if offline else check_hub_export(source)  # exactly the checked files
    try:
        root = Path(snapshot_download(source.repo_id, repo_type="dataset", revision=PARQUET_REVISION,
                                      allow_patterns=patterns, cache_dir=hub_cache_dir, local_files_only=offline))
    except Exception as e:  # offline without a cached copy, or a network error mid-download
        raise UserError(f"cannot get the {dataset} dataset ({source.repo_id}, parquet export) from the Hugging Face "
                        f"Hub ({_reason(e)}); {_hub_advice(source)}") from None
    train = [root / p for p in export_train_files(source, (p.relative_to(root).as_posix() for p in root.rglob("*.parquet")))]
    check_row_count(f"the cached parquet export of {source.repo_id} ({train[0].parent})",
                    sum(parquet_rows(f) for f in train), source.num_rows,
                    f"delete it from the Hugging Face cache (`hf cache rm dataset/{source.repo_id}`) to download it "
                    f"again, or {_local_fix(source)}")
    return train


# ---------------------------------------------------------------------------------------------- local parquet
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


def parquet_files(dataset: str, *, split: str = "train", hub_cache_dir: str | os.PathLike | None = None) -> list[Path]:
    """The parquet files of ``dataset`` in row order: a local .parquet file or folder (its ``split``), or a parquet
    export of HF_SOURCES checked and downloaded once into the Hugging Face cache (HF_HUB_OFFLINE=1 reuses it)."""
    if isinstance(HF_SOURCES.get(dataset), ParquetExport):
        return hub_export_files(dataset, hub_cache_dir=hub_cache_dir)
    path = Path(dataset).expanduser()
    if not (path.is_file() and path.suffix == ".parquet") and not (path.is_dir() and any(path.rglob("*.parquet"))):
        raise UserError(f"query dataset {dataset!r} is neither {' nor '.join(HF_SOURCES)} nor an existing .parquet "
                        "file or folder of .parquet files (nor a .zip copy of tldr-17's corpus)")
    return local_parquet_files(path, split)


# ------------------------------------------------------------------------------- tldr-17: the corpus archive
ARCHIVE_BATCH_ROWS = 8192  # rows per Arrow record batch while building: a few MB of text at a time


def tldr_field_values(lines: Iterable[bytes], field: str) -> Iterator[str | None]:
    """``field`` of each row webis/tldr-17's loading script yields from the lines of corpus-webis-tldr-17.json, as the
    built dataset holds it: a string, or None for a JSON null."""
    # huggingface/datasets datasets/reddit/reddit.py: Reddit._generate_examples (removed in 8803c182): json.loads of
    # each line of the file opened "rb"; a row for each object holding both `summary` and `content`; a field the
    # object lacks is "". datasets' Value("string").encode_example stores str(value), and a null as a null.
    for number, line in enumerate(lines, 1):
        try:
            post = json.loads(line)
        except ValueError as e:
            raise UserError(f"line {number} of {TLDR.member} is not JSON ({_reason(e)}); the archive is not "
                            "webis-tldr-17's corpus or is damaged: delete it to download it again") from None
        if not isinstance(post, dict):
            raise UserError(f"line {number} of {TLDR.member} is not a JSON object; the archive is not webis-tldr-17's "
                            "corpus: pass the corpus archive")
        if "summary" in post and "content" in post:
            value = post.get(field, "")
            yield None if value is None else str(value)


def _counted_lines(f, progress) -> Iterator[bytes]:
    """The lines of the binary file ``f``, with ``progress`` (a tqdm bar in bytes) moved every 10,000 lines."""
    done = 0
    for i, line in enumerate(f, 1):
        done += len(line)
        if i % 10_000 == 0:
            progress.update(done - progress.n)
        yield line
    progress.update(done - progress.n)


def build_archive_table(archive: Path, dest: Path, field: str, *, expected_rows: int | None = None) -> int:
    """Write ``field`` of every row the loading script yields from ``archive`` to ``dest``, an Arrow stream file of one
    string column (uncompressed, so it is memory-mapped when read), atomically; returns its rows. The archive's
    rows must number ``expected_rows`` when given, else nothing is written."""
    import pyarrow as pa

    from lm_human_preference_details.progress import progress

    schema = pa.schema([(field, pa.string())])
    rows = 0
    try:
        with zipfile.ZipFile(archive) as zf:
            try:
                info = zf.getinfo(TLDR.member)
            except KeyError:
                raise UserError(f"{archive} holds no {TLDR.member}; pass webis-tldr-17's corpus archive "
                                "(corpus-webis-tldr-17.zip)") from None
            # zipfile's own readline peeks a few bytes at a time; a buffered reader splits the same lines in C
            with (io.BufferedReader(zf.open(info), buffer_size=1 << 20) as f, atomic_path(dest) as tmp,
                  pa.OSFile(str(tmp), "wb") as sink,
                  pa.ipc.new_stream(sink, schema) as writer,
                  progress(total=info.file_size, unit="B", unit_scale=True, desc=f"reading {TLDR.member} (once)") as bar):
                batch: list[str | None] = []
                for value in tldr_field_values(_counted_lines(f, bar), field):
                    batch.append(value)
                    if len(batch) == ARCHIVE_BATCH_ROWS:
                        writer.write_batch(pa.record_batch([pa.array(batch, pa.string())], schema=schema))
                        rows, batch = rows + len(batch), []
                writer.write_batch(pa.record_batch([pa.array(batch, pa.string())], schema=schema))
                rows += len(batch)
                check_row_count(f"{archive} ({TLDR.member})", rows, expected_rows,
                                f"the archive is not the whole corpus: delete it from the Hugging Face cache "
                                f"(`hf cache rm dataset/{TLDR.repo_id}`) to download it again")
    except (OSError, EOFError, zipfile.BadZipFile, pa.ArrowException, UnicodeError) as e:  # damaged, or no zip at all
        raise UserError(f"cannot read {archive} into {dest} ({_reason(e)}); a damaged archive: delete it to download it "
                        "again, or pass another copy") from None
    return rows


def _archive_advice() -> str:
    return (f"download it on a machine with internet (`hf download {TLDR.repo_id} {TLDR.filename} --repo-type dataset`)"
            f" and run with HF_HUB_OFFLINE=1, or pass --task.query-dataset PATH/{PurePosixPath(TLDR.filename).name} "
            "(the same archive as Zenodo record 1043504)")


def hub_archive(*, hub_cache_dir: str | os.PathLike | None = None) -> Path:
    """tldr-17's corpus archive in the Hugging Face cache, downloaded once (HF_HUB_OFFLINE=1 reuses it)."""
    from huggingface_hub import hf_hub_download

    offline = hub_offline()
    if not offline:
        print(f"getting {TLDR.repo_id}/{TLDR.filename} into the Hugging Face cache; the table read from it is all "
              "later runs need")
    try:
        return Path(hf_hub_download(TLDR.repo_id, TLDR.filename, repo_type="dataset", revision=TLDR.revision,
                                    cache_dir=hub_cache_dir, local_files_only=offline))
    except Exception as e:  # offline without a cached copy, a missing file, or a network error
        raise UserError(f"cannot get the tldr-17 corpus ({TLDR.repo_id}, {TLDR.filename}) from the Hugging Face Hub "
                        f"({_reason(e)}); {_archive_advice()}") from None


def archive_table(dataset: str, field: str, *, cache_dir: str | os.PathLike | None = None,
                  hub_cache_dir: str | os.PathLike | None = None) -> Path:
    """The Arrow file of ``field`` of tldr-17's corpus, built once from the Hub's archive (``dataset`` 'tldr-17', its
    row count checked) or from a local copy (a .zip path, named by its JSON file's CRC-32 and size) into our cache."""
    from filelock import FileLock

    root = Path(cache_dir or cache_files.CACHE_DIR, "hf_queries")
    from_hub = dataset in HF_SOURCES
    if from_hub:
        archive, dest = None, root / dataset / f"{field}.arrow"
    else:
        archive = Path(dataset).expanduser()
        try:
            with zipfile.ZipFile(archive) as zf:
                info = zf.getinfo(TLDR.member)
        except (OSError, zipfile.BadZipFile, KeyError) as e:
            raise UserError(f"query dataset {dataset} is not a readable .zip holding {TLDR.member} ({_reason(e)}); "
                            "pass webis-tldr-17's corpus archive") from None
        dest = root / f"{archive.stem}-{info.CRC:08x}-{info.file_size}" / f"{field}.arrow"
    if dest.is_file():
        return dest
    archive = archive or hub_archive(hub_cache_dir=hub_cache_dir)  # offline without it: one line, nothing written
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{dest}.lock"):  # torchrun's processes build it once, one after the other finds it
        if not dest.is_file():
            build_archive_table(archive, dest, field, expected_rows=TLDR.num_rows if from_hub else None)
    return dest


# ---------------------------------------------------------------------------------------------- the data
class TextColumn:
    """One string column of a memory-mapped Arrow table (`datasets`' cache of parquet files, or our tldr-17 table)."""

    def __init__(self, table, column: str, name: str):
        self.table, self.column, self.name = table.select_columns([column]), column, name

    @classmethod
    def from_parquet(cls, files: Sequence[Path], column: str, *, cache_dir: str | os.PathLike | None = None) -> TextColumn:
        """The column of parquet ``files`` (one schema), converted once into `datasets`' Arrow cache."""
        import datasets

        try:
            table = datasets.Dataset.from_parquet([str(f) for f in files], cache_dir=cache_dir)
        except Exception as e:  # an unreadable or non-parquet file
            raise UserError(f"cannot read {files[0]} as parquet ({_reason(e)})") from None
        return cls(table, column, str(files[0] if len(files) == 1 else files[0].parent))

    @classmethod
    def from_arrow(cls, path: Path, column: str) -> TextColumn:
        """The column of an Arrow stream file (`archive_table`), memory-mapped."""
        import datasets

        try:
            return cls(datasets.Dataset.from_file(str(path)), column, str(path))
        except Exception as e:  # a damaged cache file
            raise UserError(f"cannot read {path} ({_reason(e)}); delete it to build it again") from None

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


def open_query_data(dataset: str, column: str, *, cache_dir: str | os.PathLike | None = None,
                    hub_cache_dir: str | os.PathLike | None = None,
                    datasets_cache_dir: str | os.PathLike | None = None) -> TextColumn:
    """The text column ``column`` of ``dataset`` (a HF_SOURCES name, a local .parquet file or folder, or a local .zip
    copy of tldr-17's corpus), every check done before anything large is read; rows counted where known."""
    check_query_column(dataset, column)
    source = HF_SOURCES.get(dataset)
    if isinstance(source, CorpusArchive) or (source is None and is_archive(dataset)):
        path = archive_table(dataset, column, cache_dir=cache_dir, hub_cache_dir=hub_cache_dir)
        data = TextColumn.from_arrow(path, column)
        check_row_count(str(path), len(data), source and source.num_rows, "delete it to build it again")
        if source is None and len(data) != TLDR.num_rows:
            print(f"note: {dataset} gives {len(data):,} rows, webis/tldr-17's loading script {TLDR.num_rows:,}: "
                  "this stream is not the baseline's")
        return data
    files = parquet_files(dataset, hub_cache_dir=hub_cache_dir)
    check_parquet_column(files, column)
    data = TextColumn.from_parquet(files, column, cache_dir=datasets_cache_dir)
    check_row_count(data.name, len(data), source and source.num_rows,
                    "delete it from the Hugging Face cache to download it again")
    return data


def encode_queries(tokenizer, texts: Sequence[str], *, query_length: int) -> torch.Tensor:
    """Texts as plain text (tokenizer.encode_plain), tokens[:query_length], right-padded: [len(texts), query_length]."""
    # OAI fork lm_human_preferences/language/datasets.py: _generator with start_token = end_token = None
    # (launch.py books_task, commit cbdfd00; tldr never had them): truncate, then right-pad
    pad_id = tokenizer.pad_token_id
    queries = [t[:query_length] + [pad_id] * (query_length - len(t[:query_length])) for t in encode_plain(tokenizer, texts)]
    return torch.tensor(queries, dtype=torch.long).reshape(len(texts), query_length)  # [batch, query_length]


# ---------------------------------------------------------------------------------------------- sampler
class HFQuerySampler:
    """Infinite iterator of query batches: [len(ranks) * b, query_length], b = batch_size / world_size; block i is
    emulated rank ranks[i]'s next b queries of its own stream, as the baseline's rank drew them (default: all ranks)."""

    def __init__(self, tokenizer, *, dataset: str, query_length: int, batch_size: int, seed: int,
                 world_size: int = 8, ranks: Sequence[int] | None = None, column: str | None = None,
                 start_text: str | None = None, end_text: str | None = None, window: int = DEFAULT_WINDOW,
                 cache_dir: str | os.PathLike | None = None, hub_cache_dir: str | os.PathLike | None = None,
                 datasets_cache_dir: str | os.PathLike | None = None):
        """``column``: the text column (--task.query-column); None: the baseline's for a HF_SOURCES name, `body` for a
        .zip copy of tldr-17's corpus, `text` for a local parquet."""
        if start_text is not None or end_text is not None:
            raise UserError("the baseline's Hugging Face query streams use no start/end text (fork commit cbdfd00); "
                            "set --task.start-text and --task.end-text to None")
        if world_size < 1 or batch_size < 1 or query_length < 1:
            raise UserError(f"world size ({world_size}), batch size ({batch_size}) and query length "
                            f"({query_length}) must be positive")
        if batch_size % world_size:
            raise UserError(f"a batch of {batch_size} queries does not split into {world_size} equal rank shares")
        ranks = list(range(world_size)) if ranks is None else list(ranks)
        if not ranks or any(not 0 <= r < world_size for r in ranks):
            raise UserError(f"ranks {ranks} must be a non-empty list of ranks in 0..{world_size - 1}")
        if column is None:
            source = HF_SOURCES.get(dataset) or (TLDR if is_archive(dataset) else None)
            column = source.column if source is not None else "text"
        self.data = open_query_data(dataset, column, cache_dir=cache_dir, hub_cache_dir=hub_cache_dir,
                                    datasets_cache_dir=datasets_cache_dir)
        self.tokenizer, self.query_length = tokenizer, query_length
        self.batch_size, self.world_size, self.ranks = batch_size, world_size, ranks
        self.rank_batch_size = batch_size // world_size
        stream = dict(seed=seed, world_size=world_size, window=window, cache_dir=cache_dir)
        self.streams = [RankStream(len(self.data), rank=r, **stream) for r in ranks]
        self._rank0 = self.streams[ranks.index(0)] if 0 in ranks else RankStream(len(self.data), rank=0, **stream)

    def first_text(self) -> str:
        """Rank 0's first shuffled text, the line the fork's books.py printed (`print_first_query`)."""
        # shard item 0 of rank 0 is item 0 of its shuffled dataset: the generator's i == 0
        return self.data.texts(np.array([self._rank0.first_row()]))[0]

    def next_rows(self) -> np.ndarray:
        """Dataset rows of the next batch, one block per rank of ``ranks``, in that order: [len(ranks) * b]."""
        # OAI fork lm_human_preferences/lm_tasks.py: make_query_sampler, batch(batch_size / world, drop_remainder)
        return np.concatenate([s.take(self.rank_batch_size) for s in self.streams])

    def next_texts(self) -> list[str]:
        """Texts of the next batch, one block per rank of ``ranks``."""
        return self.data.texts(self.next_rows())

    def __iter__(self) -> HFQuerySampler:
        return self

    def __next__(self) -> torch.Tensor:
        """The next [len(ranks) * b, query_length] batch."""
        return encode_queries(self.tokenizer, self.next_texts(), query_length=self.query_length)


def print_first_query(sampler, out: Callable[..., None] = print) -> str | None:
    """Print rank 0's first shuffled text as the baseline's fork did, `=========== <text>` (through ``out``, called as
    print is), and return it, when ``sampler`` (make_query_sampler's) streams a baseline source (bookcorpus, tldr-17,
    a local parquet or .zip) and holds rank 0; else None. The baseline's line is in its W&B run's output log: the same
    seed gives the same line."""
    # OAI fork lm_human_preferences/oaidatasets/books.py: books_generator, print("===========", data["text"]) for the
    # first item of the shuffled dataset (tldr.py prints nothing: its runs' logs have no such line)
    first_text = getattr(sampler, "first_text", None)
    if first_text is None or 0 not in sampler.ranks:
        return None
    text = first_text()
    out("===========", text)
    return text
