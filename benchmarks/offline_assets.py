"""Rebuild the offline task's shipped assets from their recipe, and compare them with the package's.

    python benchmarks/offline_assets.py            # build (minutes), then say whether the package's files match
    python benchmarks/offline_assets.py --write    # build and replace lm_human_preference_details/offline/assets/

The recipe is `offline_assets.build_assets` (the corpus, 1,280 pretraining steps, the shared row of the unused tokens,
2,048 best-of-4 labels from the gold scorer); `offline_assets.ship` keeps its model and labels compactly. The recipe is
bit-identical on one machine with one thread count; another CPU or thread count may round differently, so a
mismatch there says by how much the weights differ and how many labels changed.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from safetensors.torch import load_file  # noqa: E402

from lm_human_preference_details.offline import assets as offline_assets  # noqa: E402


def compare(new: Path, old: Path) -> bool:
    """Print how the shipped files in ``new`` differ from ``old``'s; -> whether they are the same."""
    a, b = load_file(str(new / "tiny-gpt2.safetensors")), load_file(str(old / "tiny-gpt2.safetensors"))
    same_keys = a.keys() == b.keys()
    diff = max(((a[k].double() - b[k].double()).abs().max().item() for k in a if k in b and a[k].shape == b[k].shape),
               default=float("inf"))
    labels_a = json.loads(gzip.decompress((new / "labels.json.gz").read_bytes()))
    labels_b = json.loads(gzip.decompress((old / "labels.json.gz").read_bytes()))
    changed = sum(x != y for x, y in zip(labels_a, labels_b)) + abs(len(labels_a) - len(labels_b))
    print(f"weights: {'same names' if same_keys else 'different names'}, largest difference {diff:.3g}; "
          f"labels: {changed} of {len(labels_b)} differ")
    return same_keys and diff == 0 and changed == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="replace the package's offline_assets/ with the build")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        built, shipped = Path(tmp) / "built", Path(tmp) / "shipped"
        built.mkdir()
        offline_assets.build_assets(built)
        offline_assets.ship(built, shipped)
        if (offline_assets.SHIPPED / "labels.json.gz").exists():
            same = compare(shipped, offline_assets.SHIPPED)
            print("the package's assets are the recipe's" if same else "the package's assets differ from this build")
        if args.write:
            offline_assets.SHIPPED.mkdir(exist_ok=True)
            for f in shipped.iterdir():
                f.replace(offline_assets.SHIPPED / f.name)
            print(f"wrote {', '.join(sorted(p.name for p in offline_assets.SHIPPED.iterdir()))} to {offline_assets.SHIPPED}")


if __name__ == "__main__":
    main()
