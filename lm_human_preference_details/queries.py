"""Query batches (FIDELITY A3-A5, E9): one constructor, `make_query_sampler`, for every source, per emulated rank.

Each of the original's ranks drew its own query stream. `make_query_sampler` gives the batches of any subset of
the emulated ranks, rank blocks side by side: the baseline's Hugging Face sources through hf_queries.py
(a shuffle per rank), the 2019 sources through `QuerySampler`, which reads one source of query_datasets.py,
encodes and processes each text (A4), repeats the stream forever and shards it across ranks the way the
original's `tf.data` pipeline does (`repeat()` then `shard(num_ranks, rank)`). `format_queries` adds the task's
prefix and suffix (A5).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Iterator, Sequence

import torch

from lm_human_preference_details.cli import UserError
from lm_human_preference_details.hf_queries import HFQuerySampler
from lm_human_preference_details.query_datasets import (
    DATASETS,
    QUERY_DATASETS,
    books_texts,
    cnndm_texts,
    is_hf_source,
    label_queries,
    local_texts,
    tldr_texts,
)
from lm_human_preference_details.tokenizer import encode_plain, single_token


def process_query(tokens: list[int], *, query_length: int, start_token: int | None, end_token: int | None,
                  pad_id: int) -> list[int] | None:
    """FIDELITY A4: cut after the first start token, truncate, cut after the last end token, right-pad; None = skip."""
    # OAI lm_human_preferences/language/datasets.py: Dataset.tf_dataset._generator
    if start_token is not None:
        if start_token not in tokens:
            return None
        first = tokens.index(start_token) + 1
        if first < len(tokens):  # a start token at the very end leaves the tokens as they are
            tokens = tokens[first:]
    tokens = tokens[:query_length]
    if end_token is not None:
        if end_token not in tokens:
            return None
        tokens = tokens[: len(tokens) - tokens[::-1].index(end_token)]
    return tokens + [pad_id] * (query_length - len(tokens))


def format_queries(queries: torch.Tensor, prefix: Sequence[int], suffix: Sequence[int]) -> torch.Tensor:
    """FIDELITY A5: [batch, q] -> [batch, len(prefix) + q + len(suffix)], pads left in place."""
    # OAI lm_human_preferences/lm_tasks.py: query_formatter
    batch = queries.shape[0]
    pre = torch.tensor(list(prefix), dtype=queries.dtype, device=queries.device).expand(batch, -1)  # [batch, p]
    suf = torch.tensor(list(suffix), dtype=queries.dtype, device=queries.device).expand(batch, -1)  # [batch, s]
    return torch.cat([pre, queries, suf], dim=1)


class QuerySampler:
    """Infinite iterator of query batches of a 2019-style source for the emulated ranks ``ranks`` of ``num_ranks``.

    The source is shuffled once with ``seed``, processed (A4), repeated, and rank r's stream is its shard r (items
    r, r + num_ranks, ...), as every rank of the original did with seed 0. Each batch holds one block of
    b = batch_size / num_ranks queries per rank of ``ranks``, in that order: [len(ranks) * b, query_length].
    """

    def __init__(self, tokenizer, *, dataset: str, query_length: int, start_text: str | None,
                 end_text: str | None, batch_size: int, mode: str = "train", seed: int = 0, num_ranks: int = 1,
                 ranks: Sequence[int] | None = None, labels_source: str | None = None):
        if mode not in ("train", "test"):
            raise UserError(f"query mode must be 'train' or 'test', got {mode!r}")
        if batch_size < 1 or query_length < 1 or num_ranks < 1:
            raise UserError(f"batch size ({batch_size}), query length ({query_length}) and ranks ({num_ranks}) "
                            "must be positive")
        if batch_size % num_ranks:
            raise UserError(f"a batch of {batch_size} queries does not split into {num_ranks} equal rank shares")
        self.ranks = list(range(num_ranks)) if ranks is None else list(ranks)
        if not self.ranks or any(not 0 <= r < num_ranks for r in self.ranks):
            raise UserError(f"ranks {self.ranks} must be a non-empty list of ranks in 0..{num_ranks - 1}")
        if dataset == "oai-label-queries" and labels_source is None:
            raise UserError("query dataset oai-label-queries needs a label file; pass --labels.source")
        if dataset not in DATASETS and not Path(dataset).is_file():
            raise UserError(f"unknown query dataset {dataset!r}; use one of {', '.join(QUERY_DATASETS)} "
                            "or an existing local .jsonl/.txt/.parquet file")
        self.tokenizer, self.dataset, self.mode, self.seed = tokenizer, dataset, mode, seed
        self.query_length, self.batch_size, self.labels_source = query_length, batch_size, labels_source
        self.num_ranks = num_ranks
        self.pad_id: int = tokenizer.pad_token_id
        self.start_token = None if start_text is None else single_token(tokenizer, start_text, "--task.start-text")
        self.end_token = None if end_text is None else single_token(tokenizer, end_text, "--task.end-text")
        self._queries = self._repeated_queries()

    def _items(self) -> Iterator[str | list[int]]:
        """One pass over the dataset: texts, or token lists for oai-label-queries."""
        if self.dataset == "books-2019":
            return books_texts(self.mode, self.seed, query_length=self.query_length)
        if self.dataset == "tldr-2019":
            return tldr_texts(self.mode, self.seed)
        if self.dataset == "cnndm":
            return cnndm_texts(self.mode, self.seed)
        if self.dataset == "oai-label-queries":
            return label_queries(self.labels_source, query_length=self.query_length, pad_id=self.pad_id,
                                 seed=self.seed)
        return local_texts(self.dataset, self.mode, self.seed)

    def _repeated_queries(self) -> Iterator[list[int]]:
        """Processed queries, the dataset repeated forever in the same seeded order (tf `repeat()`)."""
        while True:
            usable = 0
            for item in self._items():
                if isinstance(item, list):  # already-processed label queries
                    query = item
                else:
                    (tokens,) = encode_plain(self.tokenizer, [item])  # FIDELITY A1: special-token strings are text
                    query = process_query(tokens, query_length=self.query_length,
                                          start_token=self.start_token, end_token=self.end_token,
                                          pad_id=self.pad_id)
                if query is not None:
                    usable += 1
                    yield query
            if usable == 0:
                raise UserError(f"query dataset {self.dataset} ({self.mode}) gave no usable query: every text "
                                f"lacks the start token {self.start_token} or, within its first "
                                f"{self.query_length} tokens, the end token {self.end_token}; "
                                "check --task.start-text / --task.end-text")

    def __iter__(self) -> QuerySampler:
        return self

    def __next__(self) -> torch.Tensor:
        """The next batch: rank r's block is its next b items, i.e. items r, r + R, ... of the next R * b."""
        # OAI lm_human_preferences/language/datasets.py: tf_dataset, repeat() then shard(num_ranks, rank); lm_tasks.py
        # make_query_sampler: batch(batch_size / num_ranks, drop_remainder=True). Over all ranks, one batch is the
        # next batch_size items of the stream, item j of the batch going to rank j % num_ranks.
        stream = torch.tensor(list(itertools.islice(self._queries, self.batch_size)), dtype=torch.long)
        by_rank = stream.view(self.batch_size // self.num_ranks, self.num_ranks, -1).transpose(0, 1)  # [R, b, q]
        return by_rank[self.ranks].reshape(-1, self.query_length)  # [len(ranks) * b, query_length]


def make_query_sampler(tokenizer, task, *, batch_size: int, seed: int, num_ranks: int,
                       ranks: Sequence[int] | None = None, mode: str = "train", labels_source: str | None = None,
                       shuffle_seed: int = 0) -> ResumableBatches:
    """The query batches of ``task`` (a TaskHParams) for the emulated ranks ``ranks`` (default all of num_ranks).

    ``next()`` gives [len(ranks) * batch_size / num_ranks, query_length]: block i is rank ranks[i]'s next
    batch_size / num_ranks queries from rank ranks[i]'s own stream (FIDELITY E9), whatever the source:
    - the baseline's Hugging Face sources (bookcorpus, tldr-17, a local .parquet or tldr-17 .zip; text column
      task.query_column): rank r shuffles with ``seed`` + r * 100003, then takes shard r (hf_queries.py);
    - the 2019 sources (books-2019, tldr-2019, cnndm, oai-label-queries, a local .jsonl/.txt): one shuffle with
      ``shuffle_seed`` (the original's tf_dataset default 0, whatever the run seed), then shard r.
    The sampler counts its batches, so that a resumed run fast-forwards it to where it stood (checkpoint.py).
    """
    if is_hf_source(task.query_dataset):
        if mode != "train":
            raise UserError(f"query dataset {task.query_dataset} has only a train split (the baseline never read "
                            "another); use the train split (sample.py --query-mode train) or books-2019 for held-out queries")
        sampler = HFQuerySampler(tokenizer, dataset=task.query_dataset, query_length=task.query_length,
                                 batch_size=batch_size, seed=seed, world_size=num_ranks, ranks=ranks,
                                 column=task.query_column, start_text=task.start_text, end_text=task.end_text)
    else:
        sampler = QuerySampler(tokenizer, dataset=task.query_dataset, query_length=task.query_length,
                               start_text=task.start_text, end_text=task.end_text, batch_size=batch_size, mode=mode,
                               seed=shuffle_seed, num_ranks=num_ranks, ranks=ranks, labels_source=labels_source)
    return ResumableBatches(sampler)


class ResumableBatches:
    """A query sampler that counts the batches it gave: a resumed run fast-forwards a fresh one to the same point.

    Fast-forwarding (drawing and discarding) gives the same queries from any source, at the cost of encoding the
    skipped texts once more; other attributes are the wrapped sampler's.
    """

    def __init__(self, sampler: Iterator[torch.Tensor]):
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
