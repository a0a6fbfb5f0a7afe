"""A command: what runs use and make, in other tools' formats: a label file as a Hugging Face dataset (texts and
tokens), a reward model as OpenRLHF's, a task's queries as verl's RL data (docs/sharing.md).

    python -m lm_human_preference_details.export labels labels.json OUT
    python -m lm_human_preference_details.export openrlhf RUN/reward_model OUT
    python -m lm_human_preference_details.export verl TASK OUT

OUT is a new or empty directory, or one this command wrote before for the same export (then only with --overwrite):
the gate of every output decides (utils/outputs.py, docs/runs.md), before anything is read or written.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Literal

from tyro.conf import Positional

from lm_human_preference_details.label_format import OAI_PAD, read_records, record_tokens
from lm_human_preference_details.language.interop import openrlhf_config
from lm_human_preference_details.language.model import load_model_dir, write_model_files
from lm_human_preference_details.language.tokenizer import encode_plain, gpt2_tokenizer
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.tasks import get_task
from lm_human_preference_details.utils.errors import UserError, run_main
from lm_human_preference_details.utils.outputs import Output, check_output_dir, write_output_dir

PAIRS, PAIR_TOKENS, BEST_OF_N = "pairs", "pair_tokens", "best_of_4"  # the dataset's three configurations


def record_labels(path: Path, i: int, record: dict, n: int) -> list[tuple[str, int]]:
    """A record's labels (labeller, best): each of its "labels" (several labellers), else its one label by its
    "labeller" (a plain OpenAI file: "" for none); every best checked to be in 0..n-1."""
    labels = record.get("labels") or [{"labeller": record.get("labeller", ""), "best": record.get("best")}]
    found = []
    for label in [{"best": record.get("best")}, *labels]:
        best = label.get("best") if isinstance(label, dict) else None
        if not isinstance(best, int) or isinstance(best, bool) or not 0 <= best < n:
            raise UserError(f"label file {path}, record {i}: field 'best' must be an int in 0..{n - 1}, got {best!r}")
        found.append((str(label.get("labeller", "")), best))
    return found[1:]


def label_rows(source: str | Path, tokenizer) -> tuple[list[dict], list[dict], list[dict]]:
    """A best-of-N label file -> (pairs: N - 1 rows per record, its training choice `best` against each other sample,
    as texts; the same pairs as tokens, `chosen_ids` / `rejected_ids` = query + sample without the pads 50259, the
    tokens labelled; one best_of_4 row per label, in OpenAI's schema with its texts and its `labeller` ("" when the
    file names none): an item labelled by K labellers gives K rows, and `trains` marks the one whose best is the
    record's). Texts leave out the pads 50259."""
    path = Path(source)
    records = read_records(path, "SOURCE")
    if not records:
        raise UserError(f"label file {path} holds no labels")
    first = records[0] if isinstance(records[0], dict) else {}
    n = sum(1 for k in first if k.startswith("sample"))
    lengths = {k: len(v) for k, v in first.items() if isinstance(v, list)}
    pairs, pair_tokens, labels = [], [], []
    for i, record in enumerate(records):
        query = record_tokens(path, i, record, "query", lengths.get("query", 0), OAI_PAD)
        samples = [record_tokens(path, i, record, f"sample{j}", lengths.get(f"sample{j}", 0), OAI_PAD) for j in range(n)]
        given = record_labels(path, i, record, n)
        best = record["best"]
        real = [[t for t in tokens if t != OAI_PAD] for tokens in [query, *samples]]
        texts = [tokenizer.decode(tokens) for tokens in real]
        trains = str(record.get("labeller", given[0][0]))  # whose label the record's best is
        labels += [{"label": i, "query": texts[0], **{f"sample{j}": texts[1 + j] for j in range(n)}, "best": b,
                    "labeller": who, "trains": who == trains and b == best, "query_tokens": query,
                    **{f"sample{j}_tokens": s for j, s in enumerate(samples)}} for who, b in given]
        others = [j for j in range(n) if j != best]
        pairs += [{"prompt": texts[0], "chosen": texts[1 + best], "rejected": texts[1 + j], "label": i,
                   "chosen_sample": best, "rejected_sample": j} for j in others]
        pair_tokens += [{"chosen_ids": real[0] + real[1 + best], "rejected_ids": real[0] + real[1 + j],
                         "prompt_length": len(real[0]), "label": i, "chosen_sample": best, "rejected_sample": j}
                        for j in others]
    return pairs, pair_tokens, labels


DATASET_CARD = """---
license: {license}
language:
- en
task_categories:
- text-classification
- text-generation
size_categories:
- {size}
configs:
- config_name: {pairs}
  data_files: {pairs}.parquet
  default: true
- config_name: {pair_tokens}
  data_files: {pair_tokens}.parquet
- config_name: {best_of_n}
  data_files: {best_of_n}.parquet
tags:
- lm-human-preferences
- rlhf
- trl
---

# Labels of {source}

Best-of-{n} human labels in OpenAI's lm-human-preferences schema, as a Hugging Face dataset.

- `{pairs}` (default): prompt / chosen / rejected, the reward-data columns of TRL's reward and DPO trainers. Each
  best-of-{n} label that trains (the file's `best`) gives {n_minus_1} rows:
  the chosen sample against each of the other {n_minus_1} samples (`label` says which label,
  `chosen_sample` and `rejected_sample` which samples). {n_pairs} rows.
- `{pair_tokens}`: the same pairs as the tokens that were labelled: `chosen_ids` / `rejected_ids` (GPT-2 ids of
  query + sample, pads left out; the first `prompt_length` are the query's), which TRL's reward trainer takes as
  they are. Text re-encodes to other tokens now and then; these never do.
- `{best_of_n}`: one row per label: `query`, `sample0`..`sample{last}` as text, `best`, `labeller` (who gave it; empty
  when the file names none), `trains` (whether it is the label the record trains on: an item labelled by several
  labellers has a row for each, `label` says which item) and the tokens as in the file (`*_tokens`, GPT-2 ids, pad
  50259). {n_labels} rows.

TRL's trainers append EOS to text that lacks it. The samples are fixed-length continuations that often stop
mid-sentence, and no sample ended with EOS when it was labelled: a policy trained by DPO on the texts learns to stop
where they were cut. The token configuration has no EOS.

```python
import datasets
pairs = datasets.load_dataset("REPO", "{pairs}", split="train")  # from the Hub
pairs = datasets.load_dataset("parquet", data_files="DIR/{pairs}.parquet", split="train")  # from this folder
```
"""


def check_out(out: Path, kind: str, source: Path, overwrite: bool) -> Output:
    """Whether OUT may be written (utils/outputs.py: new, empty, or this export's own with --overwrite; never the
    input nor inside it), before anything is read."""
    return check_output_dir(out, kind, flag="OUT", overwrite=overwrite, inputs=[source], whole=True, noun="export")


def size_category(n: int) -> str:
    """The Hub's size category of a dataset of ``n`` rows."""
    for bound, name in ((1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M")):
        if n < bound:
            return name
    return "n>1M"


def export_labels(source: Positional[Path], out: Positional[Path], license: str = "mit", overwrite: bool = False) -> Path:
    """Write the label file ``source`` (OpenAI's best-of-N schema, or gzipped as .gz) as a Hugging Face dataset in
    ``out``: pairs.parquet (prompt/chosen/rejected), pair_tokens.parquet (the same pairs as the tokens labelled),
    best_of_4.parquet (the labels as they are) and a dataset card naming them.

    Args:
        license: the dataset card's license, a Hub license id (OpenAI's label files are MIT; yours are what you say)
        overwrite: replace OUT where an earlier `export labels` wrote it (only what it wrote there).
    """
    if not re.fullmatch(r"[a-z0-9][a-z0-9.+-]*", license):
        raise UserError(f"--license {license!r} is not a Hub license id; pass one such as mit, cc-by-4.0 or other")
    output = check_out(out, "labels", source, overwrite)
    import datasets  # seconds to import: a flag's error line never waits for it

    pairs, pair_tokens, labels = label_rows(source, gpt2_tokenizer())
    n = sum(1 for k in labels[0] if k.startswith("sample") and not k.endswith("_tokens"))
    with write_output_dir(output) as tmp:
        datasets.Dataset.from_list(pairs).to_parquet(str(tmp / f"{PAIRS}.parquet"))
        datasets.Dataset.from_list(pair_tokens).to_parquet(str(tmp / f"{PAIR_TOKENS}.parquet"))
        datasets.Dataset.from_list(labels).to_parquet(str(tmp / f"{BEST_OF_N}.parquet"))
        (tmp / "README.md").write_text(DATASET_CARD.format(
            pairs=PAIRS, pair_tokens=PAIR_TOKENS, best_of_n=BEST_OF_N, source=Path(source).name, n=n, n_minus_1=n - 1,
            last=n - 1, n_pairs=len(pairs), n_labels=len(labels), license=license, size=size_category(len(labels))))
    print(f"wrote {len(pairs)} pairs of {len(labels)} labels to {out}")
    return out


def export_openrlhf(reward_model: Positional[Path], out: Positional[Path], overwrite: bool = False) -> Path:
    """Write the saved reward model ``reward_model`` (any of ours, old head.pt ones too, their constant folded in now)
    in OpenRLHF's reward-model format to ``out``: the base model and a `score` Linear whose plain value is our reward,
    value_head_prefix `score` and normalize_reward off in its config (mean 0, std 1).

    Args:
        overwrite: replace OUT where an earlier `export openrlhf` wrote it (only what it wrote there).
    """
    output = check_out(out, "openrlhf", reward_model, overwrite)
    model, tokenizer, hparams = load_model_dir(reward_model, "reward")
    with write_output_dir(output) as tmp:
        write_model_files(tmp, model, tokenizer, hparams, final=out)
        openrlhf_config(tmp)
    print(f"wrote the OpenRLHF reward model {out}")
    return out


def verl_rows(task_name: str, num_queries: int, mode: str, seed: int) -> list[dict]:
    """``num_queries`` queries of the task ``task_name`` (its ``mode`` split, shuffled with ``seed``), processed and
    formatted as training reads them (FIDELITY A4 query processing, A5 query formatting) -> verl's RL rows: the text
    the policy reads (prefix + query + suffix, pads left out) as one user message, `data_source`, `reward_model`
    (a model's reward, no ground truth) and `extra_info` (split, index and the tokens)."""
    preset = get_task(task_name)
    task = preset.task
    if mode == "test" and preset.heldout_query_dataset:  # a local corpus keeps its test passages in a file of its own
        task = dataclasses.replace(task, query_dataset=preset.heldout_query_dataset)
    task.source.check_mode(mode)
    preset.prepare()
    task = task.resolved()
    tokenizer = gpt2_tokenizer()
    sampler = make_query_sampler(tokenizer, task, batch_size=num_queries, seed=seed, num_ranks=1, mode=mode,
                                 shuffle_seed=seed)
    prefix, suffix = encode_plain(tokenizer, [task.query_prefix, task.query_suffix])
    contexts = format_queries(next(sampler), prefix, suffix)  # [num_queries, p + query_length + s]
    rows = []
    for i, context in enumerate(contexts.tolist()):
        tokens = [t for t in context if t != tokenizer.pad_token_id]
        rows.append({"data_source": f"lm-human-preferences/{task_name}",
                     "prompt": [{"role": "user", "content": tokenizer.decode(tokens)}],
                     "ability": "lm-human-preferences", "reward_model": {"style": "model", "ground_truth": ""},
                     "extra_info": {"split": mode, "index": i, "query_tokens": tokens}})
    return rows


def export_verl(task: Positional[str], out: Positional[Path], num_queries: int = 1024,
                mode: Literal["train", "test"] = "train", seed: int = 0, overwrite: bool = False) -> Path:
    """Write queries of the task ``task`` as verl's RL data, ``out``/{mode}.parquet: each row's `prompt` one user
    message (the text the policy reads), `data_source` lm-human-preferences/TASK and `reward_model` style "model", for
    a saved reward model to score (its tokenizer's chat template concatenates the messages: query + response).

    Args:
        num_queries: queries to write
        mode: the task's split: train, or test (held out)
        seed: seed of the query order
        overwrite: replace OUT where an earlier `export verl` wrote it (only what it wrote there).
    """
    if num_queries < 1:
        raise UserError(f"--num-queries is {num_queries}; pass a positive number of queries")
    output = check_output_dir(out, "verl", flag="OUT", overwrite=overwrite, whole=True, noun="export")
    import datasets  # seconds to import: a flag's error line never waits for it

    rows = verl_rows(task, num_queries, mode, seed)
    with write_output_dir(output) as tmp:
        datasets.Dataset.from_list(rows).to_parquet(str(tmp / f"{mode}.parquet"))
    print(f"wrote {len(rows)} queries of --task {task} to {out / f'{mode}.parquet'}")
    return out


def main(argv: list[str] | None = None) -> Path:
    import tyro  # the command's parser: only when it runs as one

    return tyro.extras.subcommand_cli_from_dict({"labels": export_labels, "openrlhf": export_openrlhf, "verl": export_verl},
                                                args=argv, prog="python -m lm_human_preference_details.export")


if __name__ == "__main__":
    run_main(main)
