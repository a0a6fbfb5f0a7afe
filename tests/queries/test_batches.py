"""queries/batches.py: FIDELITY A4 query processing (by hand, against a loop transcription), A5 the formatter."""

from __future__ import annotations

import random

import torch

from lm_human_preference_details.queries import format_queries, process_query

P = 0  # pad token in the hand-worked examples


# ------------------------------------------------------------------------------ A4: process_query
def q(tokens, query_length, start=None, end=None):
    return process_query(tokens, query_length=query_length, start_token=start, end_token=end, pad_id=P)


def test_process_query_start_and_end_found():
    # first 13 at index 1 -> [7, 8, 13, 9]; last 13 -> [7, 8, 13]; padded to 5
    assert q([5, 13, 7, 8, 13, 9], 5, start=13, end=13) == [7, 8, 13, P, P]


def test_process_query_uses_the_first_start_token():
    assert q([13, 1, 13, 2], 4, start=13) == [1, 13, 2, P]


def test_process_query_skips_text_without_start_token():
    assert q([1, 2, 3], 4, start=13) is None


def test_process_query_start_token_at_the_end_keeps_the_tokens():
    # i + 1 == len(tokens): the original keeps everything, start token included
    assert q([1, 2, 13], 4, start=13) == [1, 2, 13, P]
    assert q([1, 2, 13], 4, start=13, end=13) == [1, 2, 13, P]
    assert q([13], 2, start=13) == [13, P]


def test_process_query_skips_text_without_end_token():
    assert q([1, 2, 3], 4, end=13) is None


def test_process_query_searches_the_end_token_after_truncation():
    assert q([13, 1, 2, 3, 13], 3, end=13) == [13, P, P]  # the last 13 of the first 3 tokens
    assert q([1, 2, 3, 13], 3, end=13) is None  # the text's only 13 lies past query_length


def test_process_query_truncates_and_pads_without_start_or_end():
    assert q([1, 2], 4) == [1, 2, P, P]
    assert q([1, 2, 3, 4, 5, 6], 4) == [1, 2, 3, 4]
    assert q([], 2) == [P, P]  # an empty text gives an all-pad query, as in the original


def _naive_process(tokens, query_length, start, end, pad):
    """Loop transcription of language/datasets.py _generator (try/except flow of the original)."""
    if start is not None:
        found = -1
        for i, t in enumerate(tokens):
            if t == start:
                found = i
                break
        if found < 0:
            return None
        if found + 1 < len(tokens):
            tokens = tokens[found + 1 :]
    tokens = tokens[:query_length]
    if end is not None:
        last = -1
        for i, t in enumerate(tokens):
            if t == end:
                last = i
        if last < 0:
            return None
        tokens = tokens[: last + 1]
    while len(tokens) < query_length:
        tokens = tokens + [pad]
    return tokens


def test_process_query_matches_a_loop_transcription_of_the_original():
    rng = random.Random(1)
    for _ in range(2000):
        tokens = [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        start, end = rng.choice([None, 0, 1]), rng.choice([None, 0, 2])
        ql = rng.randrange(1, 8)
        assert q(tokens, ql, start, end) == _naive_process(tokens, ql, start, end, P)


# ------------------------------------------------------------------------------ A5: format_queries
def test_format_queries():
    queries = torch.tensor([[1, 2], [3, P]])
    out = format_queries(queries, [9], [7, 8])
    assert out.tolist() == [[9, 1, 2, 7, 8], [9, 3, P, 7, 8]]  # the pad stays in the middle
    assert out.dtype == torch.long
    assert torch.equal(format_queries(queries, [], []), queries)


# ------------------------------------------------------------------------------ QuerySampler


# ------------------------------------------------------------------------------ make_query_sampler: rank blocks
