"""The two kinds of query source and their samplers, one per pipeline, behind `make_query_sampler` (FIDELITY A3 query
sources, A4 query processing, E9 per-rank seeds).

`ColumnSource` makes `HFQuerySampler`'s batches, the public baseline's: the fork ran OpenAI's TF code on 8 MPI
ranks, each of which loaded the whole `train` split, shuffled it with `Dataset.shuffle(seed + r * 100003)`, repeated
it forever and kept the items r, r + 8, r + 16, ... (`tf.data` `repeat()` then `shard(8, r)`), with no start/end
text: tokens[:query_length], right-padded. `TextSource` makes `QuerySampler`'s, the 2019 pipeline's: the source
shuffled once, each text processed (A4 query processing), the stream repeated and sharded across the ranks. Both
give the `RankBatches` interface; `ResumableBatches` counts the batches drawn, so that a resumed run fast-forwards to
the same point.
"""

from __future__ import annotations

import collections
import itertools
import os
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from lm_human_preference_details.language.tokenizer import encode_plain, single_token
from lm_human_preference_details.queries.batches import (
    Article,
    RankBatches,
    empty_text,
    encode_queries,
    process_query,
)
from lm_human_preference_details.queries.columns import TextColumn
from lm_human_preference_details.queries.source import CorpusArchive, ParquetExport, QuerySource, Request
from lm_human_preference_details.queries.streams import DEFAULT_WINDOW, RankStream
from lm_human_preference_details.utils.errors import UserError

SUMMARY = "summary"  # the field of a column source that holds a text's reference summary (tldr-17's TL;DR)


@dataclass(frozen=True)
class ColumnSource(QuerySource):
    """The baseline's pipeline: a text column, shuffled per rank (`HFQuerySampler`)."""

    read: Optional[Callable[..., TextColumn]] = None  # (source, column, *, cache_dir, hub_cache_dir, datasets_cache_dir)
    column: str = "text"  # the column the baseline read, the default of --task.query-column
    fields: Optional[tuple[str, ...]] = None  # every column, when known before anything is read
    num_rows: Optional[int] = None  # rows the baseline shuffled: another count is refused
    hub: ParquetExport | CorpusArchive | None = None  # where a Hugging Face dataset of the baseline comes from
    modes: ClassVar[tuple[str, ...]] = ("train",)
    shuffled_per_rank: ClassVar[bool] = True

    def check_mode(self, mode: str) -> None:
        if mode not in self.modes:
            raise UserError(f"query dataset {self.name} has only a train split (the baseline never read another); "
                            "use the train split (sample.py --query-mode train) or books-2019 for held-out queries")

    def gives_references(self) -> bool:
        return SUMMARY in (self.fields or ())

    def check_processing(self, start_text: str | None, end_text: str | None) -> None:
        if start_text is not None or end_text is not None:
            raise UserError("the baseline's Hugging Face query streams use no start/end text (fork commit cbdfd00); "
                            "set --task.start-text and --task.end-text to None")

    def check_request(self, request: Request) -> None:
        """--task.query-column: a field of the source where its fields are known (a local parquet's columns are
        checked once its files are found)."""
        self.check_column(request.column)

    def check_column(self, column: str) -> None:
        if self.fields is not None and column not in self.fields:
            raise UserError(f"--task.query-column {column!r} is not a field of {self.name} (its fields: "
                            f"{', '.join(self.fields)}); the baseline read {self.column!r}: pass --task.query-column "
                            f"{self.column}")

    def batches(self, tokenizer, request: Request, *, batch_size: int, num_ranks: int,
                ranks: Sequence[int] | None) -> RankBatches:
        """Rank r shuffles with the run's seed + r * 100003, then takes shard r (text column ``request.column``)."""
        self.check_mode(request.mode)
        return HFQuerySampler(tokenizer, source=self, query_length=request.query_length, batch_size=batch_size,
                              seed=request.run_seed, world_size=num_ranks, ranks=ranks, column=request.column,
                              start_text=request.start_text, end_text=request.end_text)


@dataclass(frozen=True)
class TextSource(QuerySource):
    """OpenAI's 2019 pipeline: one pass over texts or token lists in a seeded order (`QuerySampler`)."""

    items: Optional[Callable[[Request], Iterable[Any]]] = None  # texts, or processed token lists, in shuffled order
    needs_labels: bool = False  # its queries come from the label file (--labels.source)
    references: bool = False  # its texts carry reference summaries (tldr-2019, cnndm)

    def gives_references(self) -> bool:
        return self.references

    def check_request(self, request: Request) -> None:
        """A source that reads the label file's queries needs --labels.source."""
        if self.needs_labels and request.labels_source is None:
            raise UserError(f"query dataset {self.name} needs a label file; pass --labels.source")

    def batches(self, tokenizer, request: Request, *, batch_size: int, num_ranks: int,
                ranks: Sequence[int] | None) -> RankBatches:
        """One shuffle with ``request.seed`` (the original's tf_dataset default 0, whatever the run seed), then
        shard r."""
        return QuerySampler(tokenizer, source=self, query_length=request.query_length, start_text=request.start_text,
                            end_text=request.end_text, batch_size=batch_size, mode=request.mode, seed=request.seed,
                            num_ranks=num_ranks, ranks=ranks, labels_source=request.labels_source)


class HFQuerySampler(RankBatches):
    """The baseline's query batches: block i is emulated rank ranks[i]'s next b queries of its own shuffled stream,
    as the baseline's rank drew them (default: all ranks); b = batch_size / world_size."""

    def __init__(self, tokenizer, *, source: ColumnSource, query_length: int, batch_size: int, seed: int,
                 world_size: int = 8, ranks: Sequence[int] | None = None, column: str | None = None,
                 start_text: str | None = None, end_text: str | None = None, window: int = DEFAULT_WINDOW,
                 cache_dir: str | os.PathLike | None = None, hub_cache_dir: str | os.PathLike | None = None,
                 datasets_cache_dir: str | os.PathLike | None = None):
        """``column``: the text column (--task.query-column); None: the one the baseline read (`ColumnSource.column`:
        `text` of bookcorpus and of a local parquet, `body` of tldr-17 and of a .zip copy of its corpus)."""
        source.check_processing(start_text, end_text)
        super().__init__(batch_size=batch_size, query_length=query_length, num_ranks=world_size, ranks=ranks)
        column = source.column if column is None else column
        source.check_column(column)
        read = dict(cache_dir=cache_dir, hub_cache_dir=hub_cache_dir, datasets_cache_dir=datasets_cache_dir)
        self.data = source.read(source, column, **read)
        # tldr-17's TL;DR, read once the evaluation asks for it (`last_texts`)
        self.summaries = (lambda: source.read(source, SUMMARY, **read)) if SUMMARY in (source.fields or ()) else None
        self.last_rows = np.zeros(0, dtype=np.int64)
        self.tokenizer, self.world_size = tokenizer, world_size
        stream = dict(seed=seed, world_size=world_size, window=window, cache_dir=cache_dir)
        self.streams = [RankStream(len(self.data), rank=r, **stream) for r in self.ranks]
        self._rank0 = self.streams[self.ranks.index(0)] if 0 in self.ranks else RankStream(len(self.data), rank=0,
                                                                                          **stream)

    def queries_per_pass(self) -> int:
        """The smallest rank's shard of the dataset: its stream repeats after that many queries."""
        return len(self.data) // self.world_size

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

    def last_texts(self) -> list[Optional[str]]:
        texts = self.data.texts(self.last_rows)
        if self.summaries is None:
            return texts
        if callable(self.summaries):
            self.summaries = self.summaries()
        return [Article(t, r) for t, r in zip(texts, self.summaries.texts(self.last_rows))]

    def __next__(self) -> torch.Tensor:
        """The next [len(ranks) * b, query_length] batch; an empty text is one line naming its row."""
        rows = self.last_rows = self.next_rows()
        texts = self.data.texts(rows)
        for row, text in zip(rows, texts):
            if not text:
                raise UserError(empty_text(f"query dataset {self.data.name}: row {int(row)} of column "
                                           f"{self.data.column!r}", "drop that row or pass another --task.query-column"))
        return encode_queries(self.tokenizer, texts, query_length=self.query_length)


class QuerySampler(RankBatches):
    """The 2019 pipeline's query batches for the emulated ranks ``ranks`` of ``num_ranks``.

    The source is shuffled once with ``seed``, processed (A4 query processing), repeated, and rank r's stream is its shard r
, as every rank of the original did with seed 0. Each batch holds one block of
    b = batch_size / num_ranks queries per rank of ``ranks``, in that order: [len(ranks) * b, query_length].
    """

    def __init__(self, tokenizer, *, source: TextSource, query_length: int, start_text: str | None,
                 end_text: str | None, batch_size: int, mode: str = "train", seed: int = 0, num_ranks: int = 1,
                 ranks: Sequence[int] | None = None, labels_source: str | None = None):
        source.check_mode(mode)
        super().__init__(batch_size=batch_size, query_length=query_length, num_ranks=num_ranks, ranks=ranks)
        source.check_request(Request(source, mode=mode, labels_source=labels_source))
        self.tokenizer, self.source, self.mode, self.seed = tokenizer, source, mode, seed
        self.labels_source = labels_source
        self.pad_id: int = tokenizer.pad_token_id
        self.start_token = None if start_text is None else single_token(tokenizer, start_text, "--task.start-text")
        self.end_token = None if end_text is None else single_token(tokenizer, end_text, "--task.end-text")
        self.pass_size: int | None = None  # usable queries in one pass over the source, once a pass has ended
        self.given: collections.deque = collections.deque()  # the source item of each query yielded, not yet batched
        self.texts: list[Optional[str]] = []  # the last batch's
        self._queries = self._repeated_queries(self._items())  # the first pass opened now: a missing file is one line

    def queries_per_pass(self) -> int | None:
        """The usable queries of one pass over the source, once the stream went past its end (None before)."""
        return None if self.pass_size is None else self.pass_size // self.num_ranks

    def _items(self) -> Iterator[str | list[int]]:
        """One pass over the source: texts, or token lists for the label files' queries."""
        return iter(self.source.items(Request(self.source, mode=self.mode, seed=self.seed, query_length=self.query_length,
                                              pad_id=self.pad_id, labels_source=self.labels_source)))

    def _repeated_queries(self, first: Iterator[str | list[int]]) -> Iterator[list[int]]:
        """Processed queries, the dataset repeated forever in the same seeded order (tf `repeat()`), from the pass
        ``first`` on."""
        items = first
        while True:
            usable = 0
            for item in items:
                if isinstance(item, list):  # already-processed label queries
                    query = item
                else:
                    # FIDELITY A1 plain-text tokens: special-token strings are text
                    (tokens,) = encode_plain(self.tokenizer, [item])
                    query = process_query(tokens, query_length=self.query_length,
                                          start_token=self.start_token, end_token=self.end_token,
                                          pad_id=self.pad_id)
                if query is not None and query[0] == self.pad_id:
                    raise UserError(empty_text(f"a text of query dataset {self.source.name} ({self.mode})",
                                               "drop it from the source, or set --task.start-text or --task.end-text "
                                               "so that texts without them are skipped"))
                if query is not None:
                    usable += 1
                    self.given.append(None if isinstance(item, list) else item)
                    yield query
            if usable == 0:
                raise UserError(f"query dataset {self.source.name} ({self.mode}) gave no usable query: every text "
                                f"lacks the start token {self.start_token} or, within its first "
                                f"{self.query_length} tokens, the end token {self.end_token}; "
                                "check --task.start-text / --task.end-text")
            self.pass_size = usable
            items = self._items()

    def __next__(self) -> torch.Tensor:
        """The next batch: rank r's block is its next b items, i.e. items r, r + R, ... of the next R * b."""
        # OAI lm_human_preferences/language/datasets.py: tf_dataset, repeat() then shard(num_ranks, rank); lm_tasks.py
        # make_query_sampler: batch(batch_size / num_ranks, drop_remainder=True). Over all ranks, one batch is the
        # next batch_size items of the stream, item j of the batch going to rank j % num_ranks.
        stream = torch.tensor(list(itertools.islice(self._queries, self.batch_size)), dtype=torch.long)
        by_rank = stream.view(self.batch_size // self.num_ranks, self.num_ranks, -1).transpose(0, 1)  # [R, b, q]
        given = [self.given.popleft() for _ in range(self.batch_size)]
        order = torch.arange(self.batch_size).view(-1, self.num_ranks).transpose(0, 1)[self.ranks].reshape(-1)
        self.texts = [given[i] for i in order.tolist()]  # in the batch's order
        return by_rank[self.ranks].reshape(-1, self.query_length)  # [len(ranks) * b, query_length]

    def last_texts(self) -> list[Optional[str]]:
        return self.texts


def make_query_sampler(tokenizer, task, *, batch_size: int, seed: int, num_ranks: int,
                       ranks: Sequence[int] | None = None, mode: str = "train", labels_source: str | None = None,
                       shuffle_seed: int = 0) -> ResumableBatches:
    """The query batches of ``task`` (a TaskHParams) for the emulated ranks ``ranks`` (default all of num_ranks).

    ``next()`` gives [len(ranks) * batch_size / num_ranks, query_length]: block i is rank ranks[i]'s next
    batch_size / num_ranks queries from rank ranks[i]'s own stream (FIDELITY E9 per-rank seeds). The task's source
    makes them (`QuerySource.batches`): a baseline source shuffles per rank with ``seed`` + r * 100003
    (`ColumnSource`), a 2019 source once with ``shuffle_seed`` (`TextSource`).
    The sampler counts its batches, so that a resumed run fast-forwards it to where it stood (checkpoint.py).
    """
    source = task.source
    request = Request(source, mode=mode, seed=shuffle_seed, run_seed=seed, query_length=task.query_length,
                      labels_source=labels_source, column=task.query_column, start_text=task.start_text,
                      end_text=task.end_text)
    return ResumableBatches(source.batches(tokenizer, request, batch_size=batch_size, num_ranks=num_ranks, ranks=ranks))


class ResumableBatches:
    """A query sampler that counts the batches it gave: a resumed run fast-forwards a fresh one to the same point.

    Fast-forwarding (drawing and discarding) gives the same queries from any source, at the cost of encoding the
    skipped texts once more; other attributes are the wrapped sampler's.
    """

    def __init__(self, sampler: RankBatches):
        self.sampler, self.batches_drawn = sampler, 0

    def __getattr__(self, name: str):
        return getattr(self.sampler, name)

    def __iter__(self) -> ResumableBatches:
        return self

    def __next__(self) -> torch.Tensor:
        batch = next(self.sampler)
        self.batches_drawn += 1
        return batch

    def skip(self, n: int) -> None:
        """Draw and discard ``n`` batches: the stream then stands where it would after ``n`` more `next` calls."""
        for _ in range(n):
            next(self)

    def state_dict(self) -> dict[str, int]:
        return {"batches_drawn": self.batches_drawn}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state["batches_drawn"] < self.batches_drawn:
            raise ValueError(f"cannot rewind a query stream from batch {self.batches_drawn} to {state['batches_drawn']}")
        self.skip(state["batches_drawn"] - self.batches_drawn)


def print_first_query(sampler: RankBatches | ResumableBatches, out: Callable[..., None] = print) -> str | None:
    """Print rank 0's first shuffled text as the baseline's fork did, `=========== <text>` (through ``out``, called as
    print is), and return it, when ``sampler`` (make_query_sampler's) streams a baseline source (bookcorpus, tldr-17,
    a local parquet or .zip) and holds rank 0; else None. The baseline's line is in its W&B run's output log: the same
    seed gives the same line."""
    # OAI fork lm_human_preferences/oaidatasets/books.py: books_generator, print("===========", data["text"]) for the
    # first item of the shuffled dataset (tldr.py prints nothing: its runs' logs have no such line)
    if 0 not in sampler.ranks:
        return None
    text = sampler.first_text()
    if text is not None:
        out("===========", text)
    return text
