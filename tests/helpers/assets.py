"""Tiny random assets for the tests: the real GPT-2 tokenizer, a tiny random GPT-2, a query corpus and labels.

    DIR/tiny-gpt2/      tokenizer + randomly initialised GPT-2 (2 layers, 64 wide, 50257 vocab)
    DIR/queries.txt     passages separated by blank lines (a local query dataset)
    DIR/labels.json     best-of-4 labels in OpenAI's exact schema (pads 50259)
    DIR/short_labels.json  the same for queries of 16 tokens and responses of 8 (SHORT_TASK): for runs whose promise
                        does not depend on their sizes, each sampled token costing a pass of the 50257-token head
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.offline.corpus import corpus
from lm_human_preference_details.offline.pretrain import tiny_gpt2
from lm_human_preference_details.utils.files import atomic_path
from lm_human_preference_details.utils.outputs import atomic_dir


def synthetic_labels(n: int, query_length: int, response_length: int, tokenizer, seed: int = 0) -> list[dict]:
    """``n`` best-of-4 records in OpenAI's schema: the best sample is the one with the most '.' tokens."""
    rng = random.Random(seed)
    texts = corpus(n, seed + 1)
    period = tokenizer.encode(".")[0]
    words = tokenizer.encode(" the river and a garden with the old man")
    records = []
    for text in texts:
        query = tokenizer.encode(text)[:query_length]
        query = query + [OAI_PAD] * (query_length - len(query))
        samples = []
        for _ in range(4):
            sample = [period if rng.random() < rng.random() * 0.5 else rng.choice(words) for _ in range(response_length)]
            cut = rng.randint(response_length // 2, response_length)  # OAI label samples are truncated + padded
            samples.append(sample[:cut] + [OAI_PAD] * (response_length - cut))
        best = max(range(4), key=lambda i: (samples[i].count(period), -i))
        records.append({"query": query, **{f"sample{i}": s for i, s in enumerate(samples)}, "best": best})
    return records


def write_assets(out: str | Path, num_labels: int = 256, query_length: int = 64, response_length: int = 24) -> Path:
    """Write the tiny model, the query corpus and a label file under ``out``; returns ``out``."""
    out = Path(out)
    tokenizer = gpt2_tokenizer()
    with atomic_dir(out / "tiny-gpt2", replace=False) as tmp:
        tiny_gpt2().save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    with atomic_path(out / "queries.txt") as tmp:
        tmp.write_text("\n\n".join(corpus(400, seed=0)) + "\n")
    with atomic_path(out / "labels.json") as tmp:
        tmp.write_text(json.dumps(synthetic_labels(num_labels, query_length, response_length, tokenizer)))
    with atomic_path(out / "short_labels.json") as tmp:
        tmp.write_text(json.dumps(synthetic_labels(64, 16, 8, tokenizer)))
    return out


# the task flags that go with short_labels.json
SHORT_TASK = ["--task.query-length", 16, "--task.response-length", 8, "--task.truncate-after", 4]


def reward_args(assets, out, seed=3, num_train=64):
    return ["--base-model", assets / "tiny-gpt2", "--labels.source", assets / "labels.json",
            "--labels.num-train", num_train, "--batch-size", 16, "--lr", 1e-3, "--task.query-dataset", assets / "queries.txt",
            "--rollout-batch-size", 64, "--normalize-samples", 64, "--eval-labels", 32, "--seed", seed,
            "--output-dir", out, "--device", "cpu"]
