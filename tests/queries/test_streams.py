"""queries/streams.py: the seeded shuffles against `random` and `datasets`, each rank's rows, the cached window."""

from __future__ import annotations

import itertools
import random

import datasets
import numpy as np
import pytest
from helpers.queries import baseline_rank_texts, make_sampler

from lm_human_preference_details.queries import streams
from lm_human_preference_details.queries.streams import seeded_shuffle, shuffled_order


def test_seeded_shuffle_is_the_originals_global_random_shuffle():
    items = list(range(50))
    expected = list(items)
    random.seed(0)  # what books.py / tldr.py / cnndm.py do
    random.shuffle(expected)
    assert seeded_shuffle(items, 0) == expected
    assert items == list(range(50))  # the input is not touched
    assert seeded_shuffle(items, 1) != expected


@pytest.mark.parametrize("num_rows", [1, 2, 37, 10_007])
def test_shuffled_order_is_datasets_shuffle(num_rows):
    table = datasets.Dataset.from_dict({"i": list(range(num_rows))})
    for seed in (0, 1, 3 + 7 * 100003):
        expected = list(table.shuffle(seed=seed)["i"])
        assert shuffled_order(num_rows, seed).tolist() == expected


@pytest.mark.parametrize("window", [7, 1 << 17])
def test_each_rank_block_is_that_ranks_baseline_stream(tokenizer, bookcorpus_parquet, tmp_path, window):
    world, batch_size, batches, seed = 8, 16, 30, 2  # 60 queries per rank: the 37 rows repeat about 13 times
    sampler = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=batch_size, seed=seed,
                           world_size=world, window=window)
    got = [sampler.next_texts() for _ in range(batches)]
    per_rank = batch_size // world
    for rank in range(world):
        expected = baseline_rank_texts(bookcorpus_parquet, "text", seed=seed, rank=rank, world_size=world,
                                       count=batches * per_rank, cache_dir=tmp_path / "ds-cache")
        blocks = [texts[rank * per_rank : (rank + 1) * per_rank] for texts in got]
        assert list(itertools.chain(*blocks)) == expected, f"rank {rank}"
    # the ranks really differ: distinct seeds give distinct orders
    streams = {tuple(t for texts in got for t in texts[r * per_rank : (r + 1) * per_rank]) for r in range(world)}
    assert len(streams) == world


def test_batch_size_does_not_change_a_ranks_stream(tokenizer, bookcorpus_parquet, tmp_path):
    """train_reward's normalisation sampler (rollout batch) and train_policy's (PPO batch) share the rank seeds."""
    small = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=16, seed=1, world_size=8)
    large = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=32, seed=1, world_size=8)
    first_two = [small.next_rows().reshape(8, 2), small.next_rows().reshape(8, 2)]
    assert np.array_equal(large.next_rows().reshape(8, 4), np.concatenate(first_two, axis=1))


def test_first_window_is_cached(tokenizer, bookcorpus_parquet, tmp_path, monkeypatch):
    first = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=16, seed=3, world_size=8, window=20)
    rows = [first.next_rows() for _ in range(5)]
    assert len(list((tmp_path / "cache" / "hf_queries").glob("*.npy"))) == 8  # one file per rank

    def no_shuffle(*args):
        raise AssertionError("the cached window should have been used")

    monkeypatch.setattr(streams, "shuffled_order", no_shuffle)
    again = make_sampler(tokenizer, bookcorpus_parquet, tmp_path, batch_size=16, seed=3, world_size=8, window=20)
    assert all(np.array_equal(r, again.next_rows()) for r in rows)  # 10 per rank, inside the cached 20
