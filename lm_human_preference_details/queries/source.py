"""What a `--task.query-dataset` value names, as one value: a `QuerySource`, made once by `registry.query_source`.

Two kinds, the two pipelines (FIDELITY A3 query sources):
- `ColumnSource`: the public baseline's, a text column that each rank shuffles with its own seed (bookcorpus,
  tldr-17, local parquet, a local copy of tldr-17's corpus archive); train split only, no start/end text.
- `TextSource`: OpenAI's 2019 pipeline, texts (or ready token lists) that one seeded shuffle orders and the ranks
  share (books-2019, tldr-2019, cnndm, oai-label-queries, local .jsonl/.txt); a train and a test mode.
Every place that needs to know what a source is reads these fields; none looks at the name again.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterable, Optional

from lm_human_preference_details.queries.columns import TextColumn


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


@dataclass(frozen=True)
class Request:
    """What a run asks of a source: a pass over its items in a mode and seed, or the check of a run's flags."""

    source: QuerySource
    mode: str = "train"
    seed: int = 0
    query_length: int = 64
    pad_id: Optional[int] = None
    labels_source: Optional[str] = None
    column: str = "text"
    start_text: Optional[str] = None
    end_text: Optional[str] = None
    base_model: Optional[str] = None  # the tokenizer a check encodes texts with


@dataclass(frozen=True)
class QuerySource:
    """A query source: its processing defaults (FIDELITY A4 query processing), where it lies, how the run's flags are
    checked."""

    start_text: Optional[str] = None  # A4 query processing: the defaults: '.' for book passages (launch.py), else none
    end_text: Optional[str] = None
    check: Optional[Callable[[Request], None]] = None  # the checks before the run starts, each one line
    name: str = ""  # the --task.query-dataset value, filled in by `registry.query_source`
    path: Optional[Path] = None  # a local file or folder (the value, ~ expanded); None for a registered name
    modes: ClassVar[tuple[str, ...]] = ("train", "test")
    shuffled_per_rank: ClassVar[bool] = False

    def at(self, name: str, path: Path | None = None) -> QuerySource:
        """This kind of source for the value ``name`` (a registered name, or the local file or folder ``path``)."""
        return dataclasses.replace(self, name=name, path=path)


@dataclass(frozen=True)
class ColumnSource(QuerySource):
    """The baseline's pipeline: a text column, shuffled per rank (`samplers.HFQuerySampler`)."""

    read: Optional[Callable[..., TextColumn]] = None  # (source, column, *, cache_dir, hub_cache_dir, datasets_cache_dir)
    column: str = "text"  # the column the baseline read, the default of --task.query-column
    fields: Optional[tuple[str, ...]] = None  # every column, when known before anything is read
    num_rows: Optional[int] = None  # rows the baseline shuffled: another count is refused
    hub: ParquetExport | CorpusArchive | None = None  # where a Hugging Face dataset of the baseline comes from
    modes: ClassVar[tuple[str, ...]] = ("train",)
    shuffled_per_rank: ClassVar[bool] = True


@dataclass(frozen=True)
class TextSource(QuerySource):
    """OpenAI's 2019 pipeline: one pass over texts or token lists in a seeded order (`samplers.QuerySampler`)."""

    items: Optional[Callable[[Request], Iterable[Any]]] = None  # texts, or processed token lists, in shuffled order
    needs_labels: bool = False  # its queries come from the label file (--labels.source)
