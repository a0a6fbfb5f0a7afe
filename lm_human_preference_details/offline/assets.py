"""The offline task's assets: the recipe that builds them, the copy the package ships, and their cache entry.

Made deterministically and cached in `offline_dir()`:

    queries.txt / queries_test.txt   short passages written for this project (templated sentences)
    tiny-gpt2/                       a 2-layer GPT-2 with the real 50257-token vocabulary, briefly
                                     pretrained on queries.txt so its samples read like the corpus
    labels.json                      best-of-4 labels in OpenAI's exact schema (pads 50259)

The passages are written at first use (a second); the model and the labels, which take minutes to make, come from
the package's `assets/` (docs/offline.md), which `build_assets` (the recipe) wrote and `benchmarks/offline_assets.py`
rebuilds and checks.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from lm_human_preference_details.language.interop import save_plain_tokenizer
from lm_human_preference_details.language.model import Policy, disable_dropout, load_lm
from lm_human_preference_details.language.tokenizer import N_VOCAB, gpt2_tokenizer
from lm_human_preference_details.offline.corpus import NUM_LABELS, TEMPERATURE, TINY_GPT2, corpus, write_queries
from lm_human_preference_details.offline.pretrain import corpus_vocab, make_labels, pretrain, share_unused_rows, tiny_gpt2
from lm_human_preference_details.utils import files
from lm_human_preference_details.utils.errors import doing
from lm_human_preference_details.utils.files import cache_lock
from lm_human_preference_details.utils.outputs import atomic_dir

VERSION = "offline-v7"  # v7: v6's, the tiny GPT-2's tokenizer saved plain (pads with EOS, as TRL needs); v6: v5's shipped
# assets, PPO at lr 2.5e-3 (v5: 2e-3, one seed short of a target): docs/offline.md
# the version whose runs a run of VERSION repeats number for number: v7 changed only a file training never reads (the
# CI-sized run of tests/offline/test_task.py ended at KL 15.169968605041504, accuracy 0.73046875 and gain
# 0.20938501244656896 on v6 and on v7, on one CPU, 2026-11-28), so benchmarks/results/offline.md's v6 runs stand
SAME_RUNS_AS = "offline-v6"


SHIPPED = Path(__file__).with_name("assets")  # the recipe's model and labels, as built by build_assets


def offline_dir() -> Path:
    """Where the offline task's assets live ($LMHP_CACHE or ~/.cache/lm_human_preference_details)."""
    return files.CACHE_DIR / VERSION


def build_assets(out: Path) -> None:
    """The recipe of the assets, into the existing directory ``out`` (minutes on a CPU, with progress on stderr).

    Bit-identical on the same machine with the same thread count; `ship` keeps its model and labels in the package.
    """
    torch.manual_seed(0)
    tokenizer = gpt2_tokenizer()
    write_queries(out)
    model = tiny_gpt2(seed=0, **TINY_GPT2)
    pretrain(model, tokenizer, corpus(500, seed=1))
    share_unused_rows(model, corpus_vocab(tokenizer))
    model.save_pretrained(out / "tiny-gpt2")
    save_plain_tokenizer(tokenizer, out / "tiny-gpt2", N_VOCAB, "policy")
    policy = Policy(disable_dropout(model), tokenizer.pad_token_id, TEMPERATURE)
    labels = make_labels(policy, tokenizer, out / "queries.txt", NUM_LABELS, seed=3)
    (out / "labels.json").write_text(json.dumps(labels))


def ship(built: Path, shipped: Path) -> None:
    """``built`` (by build_assets) -> ``shipped``: tiny-gpt2.safetensors (the weights, the shared row once) and
    labels.json.gz (labels.json's bytes)."""
    state = load_lm(str(built / "tiny-gpt2")).state_dict()
    wte = state.pop("transformer.wte.weight")  # [V, d], tied: lm_head.weight is the same tensor
    state.pop("lm_head.weight")
    vocab = corpus_vocab(gpt2_tokenizer())
    unused = torch.ones(len(wte), dtype=torch.bool)
    unused[vocab] = False
    shared = wte[unused][0]  # the row every unused token has (share_unused_rows)
    if not torch.equal(wte[unused], shared.expand(int(unused.sum()), -1)):
        raise ValueError(f"{built / 'tiny-gpt2'}: the unused tokens' rows differ; build_assets shares them")
    state.update({"wte.vocab": vocab, "wte.rows": wte[vocab], "wte.shared": shared})
    shipped.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in state.items()}, str(shipped / "tiny-gpt2.safetensors"))
    with gzip.GzipFile(shipped / "labels.json.gz", "wb", mtime=0) as f:  # mtime 0: the same bytes every time
        f.write((built / "labels.json").read_bytes())


def unship(shipped: Path, out: Path) -> None:
    """The inverse of `ship`: tiny-gpt2/ (with the tokenizer) and labels.json into ``out``."""
    state = load_file(str(shipped / "tiny-gpt2.safetensors"))
    vocab, rows, shared = state.pop("wte.vocab"), state.pop("wte.rows"), state.pop("wte.shared")
    wte = shared.expand(N_VOCAB, len(shared)).clone()  # [V, d]
    wte[vocab] = rows
    model = tiny_gpt2(seed=0, **TINY_GPT2)
    model.load_state_dict({**state, "transformer.wte.weight": wte, "lm_head.weight": wte})
    model.save_pretrained(out / "tiny-gpt2")
    # other code (TRL) pads with the tokenizer's pad, which must be a token the model embeds; ours adds [PAD] back
    save_plain_tokenizer(gpt2_tokenizer(), out / "tiny-gpt2", N_VOCAB, "policy")
    (out / "labels.json").write_bytes(gzip.decompress((shipped / "labels.json.gz").read_bytes()))


def ensure_offline_assets(out: Path | None = None) -> Path:
    """Write the offline task's assets once (seconds: the passages, and the package's model and labels); -> their
    directory."""
    out = Path(out or offline_dir())
    if (out / "labels.json").exists():
        return out
    with cache_lock(out):  # every torchrun process gets here before the process group: one builds, the others wait
        if (out / "labels.json").exists():
            return out
        replace = out.exists()  # an incomplete entry (its labels.json deleted) is replaced; a new one never replaces
        # another's: a concurrent builder's, where the file system has no locks
        with doing(f"building the offline task's assets in {out}"), atomic_dir(out, replace=replace) as tmp:
            print(f"creating the offline task's assets in {out} (once)")
            write_queries(tmp)
            unship(SHIPPED, tmp)
    return out
