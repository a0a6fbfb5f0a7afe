"""Per-rank query streams (FIDELITY A3 query sources, E9 per-rank seeds): the seeded shuffles, the shard rule, a
rank's window of rows.

The 2019 pipeline shuffles a source once, as `random.seed(seed); random.shuffle(...)` (`seeded_shuffle`), and
shards the repeated stream across ranks. The public baseline's fork shuffled each rank's copy of a dataset with
`datasets`' `Dataset.shuffle(seed + rank * 100003)` (`shuffled_order`), repeated it and kept the rank's shard
(`shard_rows`). `RankStream` holds one rank's row indices a window at a time, so a 74M-row source costs little memory.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Iterable, TypeVar

import numpy as np

from lm_human_preference_details.ranks.emulated import rank_seed
from lm_human_preference_details.utils import files as cache_files
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.files import atomic_path

DEFAULT_WINDOW = 1 << 17  # rows kept per rank between reshuffles: a books run draws 1954 * 64 = 125,056 per rank
T = TypeVar("T")


def seeded_shuffle(items: Iterable[T], seed: int) -> list[T]:
    """A copy of ``items`` in the order `random.seed(seed); random.shuffle(items)` gives."""
    # OAI lm_human_preferences/datasets/books.py: books_generator (same in tldr.py, cnndm.py)
    items = list(items)
    random.Random(seed).shuffle(items)
    return items


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
