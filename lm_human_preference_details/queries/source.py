"""What a `--task.query-dataset` value names, as one value: a `QuerySource`, made once by `registry.query_source`
(called by `tasks.TaskHParams.source` alone) and kept with the finalized task.

A source owns what depends on its kind: its modes and start/end text (checked at flag time, `check_mode`,
`check_processing`), its own checks of the run's flags (`check_request`, `check`), and its batches (`batches`). Two
kinds, the two pipelines (FIDELITY A3 query sources), are defined beside their samplers (samplers.py):
- `ColumnSource`: the public baseline's, a text column that each rank shuffles with its own seed (bookcorpus,
  tldr-17, local parquet, a local copy of tldr-17's corpus archive); train split only, no start/end text.
- `TextSource`: OpenAI's 2019 pipeline, texts (or ready token lists) that one seeded shuffle orders and the ranks
  share (books-2019, tldr-2019, cnndm, oai-label-queries, local .jsonl/.txt); a train and a test mode.
A new kind is one subclass with its own `batches`; nobody else asks what kind a source is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, ClassVar, Optional, Sequence

from lm_human_preference_details.queries.batches import RankBatches
from lm_human_preference_details.utils.errors import UserError


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
    seed: int = 0  # the one shuffle of the 2019 pipeline (the original's tf_dataset default 0)
    run_seed: int = 0  # the run's --seed, from which each rank's own shuffle derives (the baseline's sources)
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
    checked and how its batches are made."""

    start_text: Optional[str] = None  # A4 query processing: the defaults: '.' for book passages (launch.py), else none
    end_text: Optional[str] = None
    check: Optional[Callable[[Request], None]] = None  # the checks of what it reads before the run starts, each one line
    name: str = ""  # the --task.query-dataset value, filled in by `registry.query_source`
    path: Optional[Path] = None  # a local file or folder (the value, ~ expanded); None for a registered name
    modes: ClassVar[tuple[str, ...]] = ("train", "test")
    shuffled_per_rank: ClassVar[bool] = False

    def at(self, name: str, path: Path | None = None) -> QuerySource:
        """This kind of source for the value ``name`` (a registered name, or the local file or folder ``path``)."""
        return dataclasses.replace(self, name=name, path=path)

    def check_mode(self, mode: str) -> None:
        """A one-line UserError unless the run may read this source in ``mode`` (sample.py --query-mode)."""
        if mode not in self.modes:
            raise UserError(f"query mode must be {' or '.join(map(repr, self.modes))}, got {mode!r}")

    def gives_references(self) -> bool:
        """Whether its texts carry reference summaries (`batches.Article`), for the evaluation's ROUGE table."""
        return False

    def heldout_mode(self) -> str:
        """The mode sample.py reads by default: held-out queries where the source has them."""
        return "test" if "test" in self.modes else "train"

    def check_processing(self, start_text: str | None, end_text: str | None) -> None:
        """A one-line UserError when this source cannot take ``start_text``/``end_text`` (--task.start-text,
        --task.end-text); any is fine by default."""

    def check_request(self, request: Request) -> None:
        """The run's flags against this kind of source, before anything is read: each failure one line."""

    def batches(self, tokenizer, request: Request, *, batch_size: int, num_ranks: int,
                ranks: Sequence[int] | None) -> RankBatches:
        """The query batches of a run on this source (`samplers.make_query_sampler`)."""
        raise NotImplementedError
