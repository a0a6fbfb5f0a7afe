"""Start-up time and memory of the baseline's Hugging Face query stream (lm_human_preference_details/queries/).

    python benchmarks/hf_queries_startup.py --dataset bookcorpus          # the real data (downloads once)
    python benchmarks/hf_queries_startup.py --synthetic-rows 7400423      # a bookcorpus-shaped file, made here

Prints, as one JSON line: the seconds to open the data (parquet -> Arrow cache on the first run), to compute the
8 ranks' first windows (one shuffle of all rows per rank; cached after the first run), the first and the mean
later batch, and the process's peak resident memory. Run it twice to see the cached start-up.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the package sits at the repository root


def synthetic_bookcorpus(path: Path, rows: int) -> None:
    """``rows`` lower-cased, space-tokenised sentences of 40-90 characters in one `text` column."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    words = np.array(["the", "a", "he", "she", "said", "was", "and", "of", "to", "in", "it", ",", ".", "i", "you"])
    with pq.ParquetWriter(path, pa.schema([("text", pa.string())])) as writer:
        for start in range(0, rows, 1_000_000):
            n = min(1_000_000, rows - start)
            lengths = rng.integers(8, 18, size=n)
            picks = words[rng.integers(0, len(words), size=int(lengths.sum()))]
            sentences = [" ".join(s) for s in np.split(picks, np.cumsum(lengths)[:-1])]
            writer.write_table(pa.table({"text": sentences}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", default=None, help="bookcorpus, tldr-17 or a local .parquet file or folder")
    parser.add_argument("--synthetic-rows", type=int, default=0, help="make a bookcorpus-shaped file of this many rows")
    parser.add_argument("--work-dir", default=None, help="where the synthetic file and caches go (default: a temp dir)")
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--batches", type=int, default=20)
    args = parser.parse_args()

    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
    from lm_human_preference_details.queries import HFQuerySampler
    from lm_human_preference_details.tasks import TaskHParams

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="hf_queries_bench-"))
    dataset, caches = args.dataset, {}
    if args.synthetic_rows:
        dataset = str(work / f"synthetic-{args.synthetic_rows}.parquet")
        if not Path(dataset).is_file():
            synthetic_bookcorpus(Path(dataset), args.synthetic_rows)
        caches = {"cache_dir": work / "cache", "datasets_cache_dir": work / "datasets"}
    if dataset is None:
        parser.error("pass --dataset or --synthetic-rows")

    tokenizer = gpt2_tokenizer()
    t0 = time.perf_counter()
    source = TaskHParams(query_dataset=dataset).source
    sampler = HFQuerySampler(tokenizer, source=source, query_length=64, batch_size=args.batch_size, seed=1,
                             **caches)
    t1 = time.perf_counter()
    sampler.next_rows()  # computes (or loads) every rank's first window
    t2 = time.perf_counter()
    next(sampler)
    t3 = time.perf_counter()
    for _ in range(args.batches):
        next(sampler)
    t4 = time.perf_counter()
    print(json.dumps({
        "rows": len(sampler.data), "open_s": round(t1 - t0, 2), "first_windows_s": round(t2 - t1, 2),
        "first_batch_s": round(t3 - t2, 3), "later_batch_s": round((t4 - t3) / args.batches, 4),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
    }))


if __name__ == "__main__":
    main()
