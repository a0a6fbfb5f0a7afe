"""The first build of tldr-17's table (lm_human_preference_details/queries/tldr17.py: build_archive_table): time, disk, memory.

    python benchmarks/tldr17_build.py --rows 60000                 # a synthetic corpus-webis-tldr-17.zip, made here
    python benchmarks/tldr17_build.py --archive PATH/corpus-webis-tldr-17.zip      # the real archive

The synthetic archive has the corpus's fields and lengths (the loading script's description: content 270 words on
average, summary 28; body = content + "tl;dr" + summary, normalizedBody alike), words drawn from a Zipf law so that it
compresses like text. The build runs in a child process; prints one JSON line: the archive's and the JSON file's
bytes, the rows, the build's wall and CPU seconds, the table's bytes, the child's peak resident memory (the package
imports torch), and each size and time scaled linearly to the real corpus's 3,848,330 rows (the build reads the file
once, line by line, in batches of rows, so its memory does not grow with the corpus: compare two --rows).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the package sits at the repository root

REAL_ROWS = 3_848_330  # rows the loading script yields from the real corpus


def synthetic_archive(path: Path, rows: int, seed: int = 0) -> None:
    """``rows`` posts in corpus-webis-tldr-17.json's format, zipped (deflate), written one line at a time."""
    rng = np.random.default_rng(seed)
    vocab = np.array([f"w{i}" if i % 7 else f"word{i}" for i in range(20_000)])
    cdf = np.cumsum(1.0 / np.arange(1, len(vocab) + 1))
    cdf /= cdf[-1]

    def words(n: float) -> str:
        return " ".join(vocab[np.searchsorted(cdf, rng.random(max(int(n), 1)))])

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf, \
            zf.open("corpus-webis-tldr-17.json", "w", force_zip64=True) as f:
        for i in range(rows):
            content = words(rng.lognormal(np.log(270) - 0.32, 0.8)).replace(" w1 ", ".\n\n", 2)
            summary = words(rng.lognormal(np.log(28) - 0.245, 0.7))
            body = f"{content}\n\ntl;dr: {summary}"
            post = {"author": f"user{i % 50_000}", "body": body, "normalizedBody": body.replace("\n", " "),
                    "content": content, "content_len": content.count(" ") + 1, "summary": summary,
                    "summary_len": summary.count(" ") + 1, "id": f"c{i:06x}", "subreddit": "AskReddit",
                    "subreddit_id": "t5_2qh1i"}
            f.write(json.dumps(post).encode() + b"\n")


def build(archive: str, dest: str) -> None:
    """The child: build the body table; print its rows and seconds."""
    from lm_human_preference_details.queries.tldr17 import build_archive_table

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    rows = build_archive_table(Path(archive), Path(dest), "body")
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - t0, "cpu_seconds": cpu() - c0}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=60_000, help="posts in the synthetic archive")
    parser.add_argument("--archive", default=None, help="a real corpus-webis-tldr-17.zip instead of a synthetic one")
    parser.add_argument("--work-dir", default=None, help="where the archive and the table go (default: a temp dir)")
    parser.add_argument("--build", nargs=2, metavar=("ARCHIVE", "DEST"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build:
        build(*args.build)
        return

    work = Path(args.work_dir or tempfile.mkdtemp(prefix="tldr17_build-"))
    work.mkdir(parents=True, exist_ok=True)
    archive = Path(args.archive) if args.archive else work / f"synthetic-{args.rows}.zip"
    if not archive.is_file():
        synthetic_archive(archive, args.rows)
    dest = work / "table" / "body.arrow"
    child = subprocess.run([sys.executable, __file__, "--build", str(archive), str(dest)], capture_output=True,
                           text=True, check=True)
    result = json.loads(child.stdout.strip().splitlines()[-1])
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # Linux: KiB
    json_bytes = zipfile.ZipFile(archive).getinfo("corpus-webis-tldr-17.json").file_size
    scale = REAL_ROWS / result["rows"]
    print(json.dumps({
        "rows": result["rows"], "zip_bytes": archive.stat().st_size, "json_bytes": json_bytes,
        "build_s": round(result["seconds"], 2), "build_cpu_s": round(result["cpu_seconds"], 2),
        "table_bytes": dest.stat().st_size, "peak_rss_bytes": peak,
        "at_3848330_rows": {"json_bytes": round(json_bytes * scale), "zip_bytes": round(archive.stat().st_size * scale),
                            "build_s": round(result["seconds"] * scale), "build_cpu_s": round(result["cpu_seconds"] * scale),
                            "table_bytes": round(dest.stat().st_size * scale)},
    }))


if __name__ == "__main__":
    main()
