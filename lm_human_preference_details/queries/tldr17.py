"""tldr-17, the baseline's tldr queries: webis/tldr-17's corpus archive, read as its loading script read it.

The Hub's parquet export of webis/tldr-17 is partial, so the archive data/corpus-webis-tldr-17.zip (or a local copy)
is read line by line under the loading script's row rule, and one field of every row is kept once in an Arrow file of
our cache, its row count checked; later runs memory-map that file (docs/data-sources.md).
"""

from __future__ import annotations

import io
import json
import os
import zipfile
from pathlib import Path, PurePosixPath
from typing import Callable, Iterable, Iterator

from filelock import FileLock

from lm_human_preference_details.queries.columns import TextColumn, check_row_count
from lm_human_preference_details.queries.columns import reason as _reason
from lm_human_preference_details.queries.hub import hub_offline
from lm_human_preference_details.queries.source import CorpusArchive, QuerySource
from lm_human_preference_details.utils import files as cache_files
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import atomic_path
from lm_human_preference_details.utils.progress import progress

# OAI fork lm_human_preferences/oaidatasets/tldr.py: load_dataset("webis/tldr-17", split=mode), data["body"];
# the repo's data/ holds the corpus archive of Zenodo record 1043504, which the loading script read
TLDR = CorpusArchive("webis/tldr-17", "data/corpus-webis-tldr-17.zip", "main", "corpus-webis-tldr-17.json", "body",
                     3_848_330)
# the string fields of each tldr-17 row (huggingface/datasets datasets/reddit/reddit.py: _ADDITIONAL_FEATURES + the two)
TLDR_FIELDS = ("author", "body", "normalizedBody", "subreddit", "subreddit_id", "id", "content", "summary")


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
    # pyarrow takes about a second to import: only the one run that builds the table pays it
    import pyarrow as pa

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
    # huggingface_hub's API takes about a second to import: only a download pays it
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


def archive_table(dest: Path, field: str, archive: Callable[[], Path], expected_rows: int | None) -> Path:
    """``dest``, the Arrow file of ``field`` of tldr-17's corpus, built once into our cache from the archive that
    ``archive()`` gives (called only when ``dest`` is missing), its rows checked against ``expected_rows``."""
    if dest.is_file():
        return dest
    path = archive()  # offline without it: one line, nothing written
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{dest}.lock"):  # torchrun's processes build it once, one after the other finds it
        if not dest.is_file():
            build_archive_table(path, dest, field, expected_rows=expected_rows)
    return dest


def _counted(path: Path, column: str, expected_rows: int | None) -> TextColumn:
    data = TextColumn.from_arrow(path, column)
    check_row_count(str(path), len(data), expected_rows, "delete it to build it again")
    return data


def read_hub_archive(source: QuerySource, column: str, *, cache_dir: str | os.PathLike | None = None,
                     hub_cache_dir: str | os.PathLike | None = None, **_) -> TextColumn:
    """The column ``column`` of tldr-17's corpus from the Hub's archive (downloaded once), its rows counted."""
    dest = Path(cache_dir or cache_files.CACHE_DIR, "hf_queries", source.name, f"{column}.arrow")
    path = archive_table(dest, column, lambda: hub_archive(hub_cache_dir=hub_cache_dir), source.num_rows)
    return _counted(path, column, source.num_rows)


def read_local_archive(source: QuerySource, column: str, *, cache_dir: str | os.PathLike | None = None,
                       **_) -> TextColumn:
    """The column ``column`` of a local copy of tldr-17's corpus archive (``source.path``), its table named by its
    JSON file's CRC-32 and size; a count other than the loading script's is said in a note."""
    try:
        with zipfile.ZipFile(source.path) as zf:
            info = zf.getinfo(TLDR.member)
    except (OSError, zipfile.BadZipFile, KeyError) as e:
        raise UserError(f"query dataset {source.name} is not a readable .zip holding {TLDR.member} ({_reason(e)}); "
                        "pass webis-tldr-17's corpus archive") from None
    dest = Path(cache_dir or cache_files.CACHE_DIR, "hf_queries",
                f"{source.path.stem}-{info.CRC:08x}-{info.file_size}", f"{column}.arrow")
    data = _counted(archive_table(dest, column, lambda: source.path, source.num_rows), column, source.num_rows)
    if len(data) != TLDR.num_rows:
        print(f"note: {source.name} gives {len(data):,} rows, webis/tldr-17's loading script {TLDR.num_rows:,}: "
              "this stream is not the baseline's")
    return data
