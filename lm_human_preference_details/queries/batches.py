"""Query processing and batching (FIDELITY A1 plain-text tokens, A4 query processing, A5 query formatting, E9
per-rank seeds): what every query sampler shares.

`process_query` is the 2019 pipeline's processing (A4 query processing), `encode_queries` the baseline's
(tokens[:query_length], right-padded), `format_queries` puts the task's prefix and suffix around a batch (A5 query
formatting). `RankBatches` is the one interface of a query sampler: an infinite iterator of
[len(ranks) * b, query_length] batches, b = batch_size / num_ranks, block i being emulated rank ranks[i]'s next b
queries; its sizes are checked here, once, for every source.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from lm_human_preference_details.language.tokenizer import encode_plain
from lm_human_preference_details.utils.errors import UserError


def process_query(tokens: list[int], *, query_length: int, start_token: int | None, end_token: int | None,
                  pad_id: int) -> list[int] | None:
    """FIDELITY A4 query processing: cut after the first start token, truncate, cut after the last end token,
    right-pad; None = skip."""
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
    """FIDELITY A5 query formatting: [batch, q] -> [batch, len(prefix) + q + len(suffix)], pads left in place."""
    # OAI lm_human_preferences/lm_tasks.py: query_formatter
    batch = queries.shape[0]
    pre = torch.tensor(list(prefix), dtype=queries.dtype, device=queries.device).expand(batch, -1)  # [batch, p]
    suf = torch.tensor(list(suffix), dtype=queries.dtype, device=queries.device).expand(batch, -1)  # [batch, s]
    return torch.cat([pre, queries, suf], dim=1)


def encode_queries(tokenizer, texts: Sequence[str], *, query_length: int) -> torch.Tensor:
    """Texts as plain text (tokenizer.encode_plain), tokens[:query_length], right-padded: [len(texts), query_length]."""
    # OAI fork lm_human_preferences/language/datasets.py: _generator with start_token = end_token = None
    # (launch.py books_task, commit cbdfd00; tldr never had them): truncate, then right-pad
    pad_id = tokenizer.pad_token_id
    queries = [t[:query_length] + [pad_id] * (query_length - len(t[:query_length])) for t in encode_plain(tokenizer, texts)]
    return torch.tensor(queries, dtype=torch.long).reshape(len(texts), query_length)  # [batch, query_length]


def empty_text(what: str, fix: str) -> str:
    """Why an empty text cannot be a query: the original cannot run it either (FIDELITY B2 last real token)."""
    # OAI lm_human_preferences/language/model.py: Model.__call__ asserts that every position has a real token at or
    # before it (tf.assert_none_equal(use_indices, -1)); an empty text is a query of pads only, and the reward model
    # reads [query, response] without the prefix, so the original stops at that text
    return (f"{what} is an empty text, a query of pads only, which the original's model cannot read (it asserts a "
            f"sequence's first token is real); {fix}")


class Article(str):
    """A query's text that carries its reference summary (tldr's TL;DR, cnndm's highlights): the pipeline processes it
    as the text it is, and the evaluation's ROUGE table reads ``reference``."""

    reference: Optional[str]

    def __new__(cls, text: str, reference: Optional[str]) -> Article:
        article = super().__new__(cls, text)
        article.reference = reference
        return article


class RankBatches:
    """Infinite iterator of query batches for the emulated ranks ``ranks`` (default all) of ``num_ranks``:
    [len(ranks) * b, query_length], b = batch_size / num_ranks, block i being rank ranks[i]'s next b queries."""

    def __init__(self, *, batch_size: int, query_length: int, num_ranks: int, ranks: Sequence[int] | None):
        # OAI lm_human_preferences/lm_tasks.py: make_query_sampler, batch(exact_div(batch_size, num_ranks))
        if num_ranks < 1 or batch_size < 1 or query_length < 1:
            raise UserError(f"batch size ({batch_size}), query length ({query_length}) and ranks ({num_ranks}) "
                            "must be positive")
        if batch_size % num_ranks:
            raise UserError(f"a batch of {batch_size} queries does not split into {num_ranks} equal rank shares")
        self.ranks = list(range(num_ranks)) if ranks is None else list(ranks)
        if not self.ranks or any(not 0 <= r < num_ranks for r in self.ranks):
            raise UserError(f"ranks {self.ranks} must be a non-empty list of ranks in 0..{num_ranks - 1}")
        self.batch_size, self.query_length, self.num_ranks = batch_size, query_length, num_ranks
        self.rank_batch_size = batch_size // num_ranks

    def __iter__(self) -> RankBatches:
        return self

    def __next__(self) -> torch.Tensor:
        """The next [len(ranks) * b, query_length] batch."""
        raise NotImplementedError

    def queries_per_pass(self) -> int | None:
        """How many queries one rank draws before its stream repeats, once known (None: not yet, or never)."""
        return None

    def first_text(self) -> str | None:
        """Rank 0's first text, for a source whose log line the baseline printed (`print_first_query`); else None."""
        return None

    def last_texts(self) -> list[Optional[str]]:
        """The source texts of the last batch's queries, in its order (an `Article` where the source gives its
        reference summary); None for a query that came as tokens."""
        raise NotImplementedError
