"""FIDELITY A4, A5, E9: query processing, the query formatter, the 2019 query sampler's rank blocks, make_query_sampler."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from lm_human_preference_details.labels import OAI_PAD
from lm_human_preference_details.queries import QuerySampler, format_queries, make_query_sampler, process_query, query_source
from lm_human_preference_details.queries.streams import seeded_shuffle
from lm_human_preference_details.tasks import TaskHParams
from lm_human_preference_details.utils.errors import UserError

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
PASSAGES = [
    "Intro. The cat sat. The dog ran far away from home today",  # -> " The cat sat."
    "No period here at all",  # no start token: skipped
    "Start. but no end within the first eight tokens of this passage. End.",  # no end in 8 tokens: skipped
    "A. B.",  # -> " B."
]


def _sampler(tokenizer, dataset, **kw):
    args = dict(source=query_source(str(dataset)), query_length=8, start_text=".", end_text=".", batch_size=3)
    return QuerySampler(tokenizer, **{**args, **kw})


def _texts(tokenizer, batch):
    return [tokenizer.decode([t for t in row if t != tokenizer.pad_token_id]) for row in batch.tolist()]


def test_query_sampler_processes_repeats_and_pads(tokenizer, tmp_path):
    path = tmp_path / "q.txt"
    path.write_text("\n\n".join(PASSAGES))
    sampler = _sampler(tokenizer, path)
    first, second = next(sampler), next(sampler)
    assert first.shape == (3, 8) and first.dtype == torch.long
    expected = {PASSAGES[0]: " The cat sat.", PASSAGES[3]: " B."}
    cycle = [expected[p] for p in seeded_shuffle(PASSAGES, 0) if p in expected]  # the dataset repeats in order
    assert _texts(tokenizer, torch.cat([first, second])) == (cycle * 3)[:6]
    row = first[_texts(tokenizer, first).index(" B.")].tolist()
    assert row == tokenizer.encode(" B.") + [50257] * 6  # right-padded with [PAD]


def test_query_sampler_shards_the_repeated_stream(tokenizer, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(f"Hi. Passage {i} here. Tail") + "\n" for i in range(5)))
    whole = next(_sampler(tokenizer, path, batch_size=12))  # 5 texts: ranks cross epoch boundaries
    for rank in range(2):
        local = next(_sampler(tokenizer, path, batch_size=12, num_ranks=2, ranks=[rank]))
        assert torch.equal(local, whole[rank::2])


def test_query_sampler_errors(tokenizer, tmp_path):
    path = tmp_path / "q.txt"
    path.write_text("no start token\n\nnone here either")
    with pytest.raises(UserError, match="gave no usable query"):
        next(_sampler(tokenizer, path))
    with pytest.raises(UserError, match="unknown query dataset 'bookz'"):
        _sampler(tokenizer, "bookz")
    with pytest.raises(UserError, match="needs a label file"):
        _sampler(tokenizer, "oai-label-queries")
    with pytest.raises(UserError, match="--task.start-text 'two words' encodes to 2 tokens"):
        _sampler(tokenizer, path, start_text="two words")


def test_query_sampler_oai_label_queries(tokenizer, tmp_path):
    labels = tmp_path / "labels.json"
    records = [{"query": [i, 13, OAI_PAD, OAI_PAD], "sample0": [1], "best": 0} for i in range(3)]
    labels.write_text(json.dumps(records))
    sampler = _sampler(tokenizer, "oai-label-queries", query_length=4, labels_source=str(labels))
    batch = next(sampler)  # yielded as they are, only the pad mapped (FIDELITY A2)
    assert batch.tolist() == [[i, 13, 50257, 50257] for i in seeded_shuffle(range(3), 0)]
    with pytest.raises(UserError, match="record 0: query has 4 tokens but --task.query-length is 5"):
        next(_sampler(tokenizer, "oai-label-queries", query_length=5, labels_source=str(labels)))


def test_query_sampler_special_token_strings_are_plain_text(tokenizer, tmp_path):
    path = tmp_path / "q.jsonl"
    texts = ["He wrote <|endoftext|> on the wall.", "A [PAD] is not padding."]
    path.write_text("".join(json.dumps(t) + "\n" for t in texts))
    batch = next(_sampler(tokenizer, path, query_length=16, start_text=None, end_text=None, batch_size=2))
    pad = tokenizer.pad_token_id
    rows = {tokenizer.decode([t for t in row if t != pad]): row for row in batch.tolist()}
    assert set(rows) == set(texts)  # both texts come back whole: nothing was read as a special token
    for text, row in rows.items():
        real = [t for t in row if t != pad]
        assert max(real) < 50256 and row == real + [pad] * (16 - len(real))
    # by hand: '<|endoftext|>' is the BPE pieces '<', '|', 'end', 'of', 'text', '|', '>', never id 50256
    assert rows[texts[0]][2:9] == [1279, 91, 437, 1659, 5239, 91, 29]


# ------------------------------------------------------------------------------ make_query_sampler: rank blocks
def _rank_stream(texts, rank, num_ranks, count):
    """Rank ``rank``'s first ``count`` texts in the original: one seed-0 shuffle, repeat(), shard(num_ranks, rank)."""
    shuffled = seeded_shuffle(texts, 0)  # books.py: random.seed(0); random.shuffle(datas)
    repeated = [shuffled[i % len(shuffled)] for i in range(num_ranks * count)]
    return repeated[rank::num_ranks][:count]


def test_make_query_sampler_2019_source_rank_blocks(tokenizer, tmp_path):
    texts = [f"Passage number {i} here" for i in range(7)]
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in texts))
    task = TaskHParams(query_dataset=str(path), query_length=6, start_text=None, end_text=None)
    num_ranks, batch_size, batches = 4, 8, 3  # 2 queries per rank per batch; 24 items: the 7 texts repeat
    sampler = make_query_sampler(tokenizer, task, batch_size=batch_size, seed=123, num_ranks=num_ranks)
    got = [_texts(tokenizer, next(sampler)) for _ in range(batches)]
    assert all(len(b) == batch_size for b in got)
    for rank in range(num_ranks):
        blocks = [b[2 * rank : 2 * rank + 2] for b in got]  # block r = rank r's next 2 queries
        expected = _rank_stream(texts, rank, num_ranks, 2 * batches)
        assert [t for block in blocks for t in block] == expected, rank
    # a subset of the ranks (another process's share) gives exactly those blocks, in the order asked
    part = make_query_sampler(tokenizer, task, batch_size=batch_size, seed=123, num_ranks=num_ranks, ranks=[3, 1])
    for b in got:
        assert _texts(tokenizer, next(part)) == b[6:8] + b[2:4]


def test_make_query_sampler_hf_source_rank_blocks(tokenizer, tmp_path, monkeypatch):
    """The baseline's source through the one constructor: rank r's block is rank r's stream of HFQuerySampler."""
    import datasets

    from lm_human_preference_details.utils import files

    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    path = tmp_path / "books.parquet"
    datasets.Dataset.from_dict({"text": [f"sentence {i} ." for i in range(19)]}).to_parquet(str(path))
    task = TaskHParams(query_dataset=str(path), query_length=5).resolved()  # a parquet file: no start/end text
    assert (task.start_text, task.end_text) == (None, None)
    whole = make_query_sampler(tokenizer, task, batch_size=8, seed=4, num_ranks=4)
    part = make_query_sampler(tokenizer, task, batch_size=8, seed=4, num_ranks=4, ranks=[2])
    order = np.random.default_rng(4 + 2 * 100003).permutation(19)  # datasets' shuffle(seed + rank * 100003)
    for k in range(3):
        rows, part_rows = whole.next_rows(), part.next_rows()
        assert np.array_equal(part_rows, rows[4:6])  # rank 2's block of the full batch
        # shard(4, 2) of the repeated stream: items 2 + 4j, j = 2k, 2k + 1
        assert part_rows.tolist() == [order[(2 + 4 * j) % 19] for j in (2 * k, 2 * k + 1)]
    with pytest.raises(UserError, match="has only a train split"):
        make_query_sampler(tokenizer, task, batch_size=8, seed=4, num_ranks=4, mode="test")


def test_make_query_sampler_errors(tokenizer, tmp_path):
    path = tmp_path / "q.txt"
    path.write_text("Hi. There.")
    task = TaskHParams(query_dataset=str(path), query_length=4).resolved()
    with pytest.raises(UserError, match="does not split into 3 equal rank shares"):
        make_query_sampler(tokenizer, task, batch_size=8, seed=0, num_ranks=3)
    with pytest.raises(UserError, match=r"ranks \[4\] must be a non-empty list of ranks in 0..3"):
        make_query_sampler(tokenizer, task, batch_size=8, seed=0, num_ranks=4, ranks=[4])


def test_query_sampler_resumes_where_it_stood(tokenizer, tmp_path):
    # checkpoint.py: a resumed run fast-forwards a fresh sampler by the batches the saved one had drawn
    path = tmp_path / "q.jsonl"
    path.write_text("".join(json.dumps(f"Hi. Passage {i} here. Tail") + "\n" for i in range(5)))
    task = TaskHParams(query_dataset=str(path), query_length=8, start_text=".", end_text=".")
    sampler = lambda: make_query_sampler(tokenizer, task, batch_size=4, seed=0, num_ranks=2, ranks=[1])  # noqa: E731
    saved = sampler()
    drawn = [next(saved) for _ in range(4)]  # 8 of rank 1's queries: past the end of the 5-text dataset
    resumed = sampler()
    resumed.load_state_dict(saved.state_dict())
    assert saved.state_dict() == {"batches_drawn": 4} and resumed.batches_drawn == 4
    assert torch.equal(next(resumed), next(saved)) and torch.equal(next(resumed), next(saved))
    fresh = sampler()
    fresh.skip(2)
    assert torch.equal(next(fresh), drawn[2])
    with pytest.raises(ValueError, match="cannot rewind"):
        saved.load_state_dict({"batches_drawn": 1})
