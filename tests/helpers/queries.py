"""Small query files in the schemas of the baseline's Hugging Face sources, a Hugging Face cache holding them, a sampler
of them, and each rank's stream as the baseline's fork built it with `datasets` itself."""

from __future__ import annotations

import itertools
import zipfile

from lm_human_preference_details.queries import registry
from lm_human_preference_details.queries.samplers import HFQuerySampler


def write_tldr_zip(path, lines: list[bytes]):
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("corpus-webis-tldr-17.json", b"".join(line + b"\n" for line in lines))
    return path


def baseline_rank_texts(path, column: str, *, seed: int, rank: int, world_size: int, count: int, cache_dir) -> list:
    """Rank ``rank``'s first ``count`` texts the fork's pipeline yields, built with `datasets` itself; ``path`` is a
    parquet file or a `datasets.Dataset`."""
    import datasets  # seconds to import: only the tests that compare with it pay it

    dataset = path if isinstance(path, datasets.Dataset) else datasets.Dataset.from_parquet(
        str(path), cache_dir=str(cache_dir))  # load_dataset(..., split=mode)
    shuffled = list(dataset.shuffle(seed=seed + rank * 100003)[column])  # books_generator: dataset.shuffle(seed)

    def repeated():  # tf_dataset.repeat(): the generator runs again, with the same seed, after each epoch
        while True:
            yield from shuffled

    return list(itertools.islice(repeated(), rank, rank + world_size * count, world_size))  # .shard(world, rank)


def make_sampler(tokenizer, path, tmp_path, **kwargs):
    kwargs.setdefault("query_length", 8)
    return HFQuerySampler(tokenizer, source=registry.query_source(str(path)), cache_dir=tmp_path / "cache",
                          datasets_cache_dir=tmp_path / "ds-cache", **kwargs)


def fake_hub_cache(root, repo_id: str, revision: str, files: dict) -> None:
    """A Hugging Face cache holding ``files`` (path in repo -> local path) of ``repo_id`` at ``revision``."""
    repo = root / f"datasets--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (repo / "refs" / revision).parent.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    for name, source in files.items():
        dest = repo / "snapshots" / commit / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(source.read_bytes())
