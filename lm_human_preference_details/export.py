"""A command: what runs use and make, in other tools' formats: a label file as a Hugging Face dataset, a reward model
as OpenRLHF's (docs/sharing.md).

    python -m lm_human_preference_details.export labels labels.json OUT
    python -m lm_human_preference_details.export openrlhf RUN/reward_model OUT

OUT is a new or empty directory, or one this command wrote before for the same export (then only with --overwrite):
the gate of every output decides (utils/outputs.py, docs/runs.md), before anything is read or written.
"""

from __future__ import annotations

from pathlib import Path

from tyro.conf import Positional

from lm_human_preference_details.labels import OAI_PAD, read_records, record_tokens
from lm_human_preference_details.language.interop import openrlhf_config
from lm_human_preference_details.language.model import load_model_dir, write_model_files
from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.utils.errors import UserError, run_main
from lm_human_preference_details.utils.outputs import Output, check_output_dir, write_output_dir

PAIRS, BEST_OF_N = "pairs", "best_of_4"  # the dataset's two configurations


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


def label_rows(source: str | Path, tokenizer) -> tuple[list[dict], list[dict]]:
    """A best-of-N label file -> (pairs: N - 1 rows per record, its training choice `best` against each other sample;
    one best_of_4 row per label, in OpenAI's schema with its texts and its `labeller` ("" when the file names none): an
    item labelled by K labellers gives K rows, and `trains` marks the one whose best is the record's). Texts leave out
    the pads 50259."""
    path = Path(source)
    records = read_records(path, "SOURCE")
    if not records:
        raise UserError(f"label file {path} holds no labels")
    first = records[0] if isinstance(records[0], dict) else {}
    n = sum(1 for k in first if k.startswith("sample"))
    lengths = {k: len(v) for k, v in first.items() if isinstance(v, list)}
    pairs, labels = [], []
    for i, record in enumerate(records):
        query = record_tokens(path, i, record, "query", lengths.get("query", 0), OAI_PAD)
        samples = [record_tokens(path, i, record, f"sample{j}", lengths.get(f"sample{j}", 0), OAI_PAD) for j in range(n)]
        given = record_labels(path, i, record, n)
        best = record["best"]
        texts = [tokenizer.decode([t for t in tokens if t != OAI_PAD]) for tokens in [query, *samples]]
        trains = str(record.get("labeller", given[0][0]))  # whose label the record's best is
        labels += [{"label": i, "query": texts[0], **{f"sample{j}": texts[1 + j] for j in range(n)}, "best": b,
                    "labeller": who, "trains": who == trains and b == best, "query_tokens": query,
                    **{f"sample{j}_tokens": s for j, s in enumerate(samples)}} for who, b in given]
        pairs += [{"prompt": texts[0], "chosen": texts[1 + best], "rejected": texts[1 + j], "label": i,
                   "chosen_sample": best, "rejected_sample": j} for j in range(n) if j != best]
    return pairs, labels


DATASET_CARD = """---
configs:
- config_name: {pairs}
  data_files: {pairs}.parquet
  default: true
- config_name: {best_of_n}
  data_files: {best_of_n}.parquet
tags:
- lm-human-preferences
- rlhf
---

# Labels of {source}

Best-of-{n} human labels in OpenAI's lm-human-preferences schema, as a Hugging Face dataset.

- `{pairs}` (default): prompt / chosen / rejected, the reward-data columns of TRL's reward trainer. Each best-of-{n}
  label that trains (the file's `best`) gives {n_minus_1} rows:
  the chosen sample against each of the other {n_minus_1} samples (`label` says which label,
  `chosen_sample` and `rejected_sample` which samples). {n_pairs} rows.
- `{best_of_n}`: one row per label: `query`, `sample0`..`sample{last}` as text, `best`, `labeller` (who gave it; empty
  when the file names none), `trains` (whether it is the label the record trains on: an item labelled by several
  labellers has a row for each, `label` says which item) and the tokens as in the file (`*_tokens`, GPT-2 ids, pad
  50259). {n_labels} rows.

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


def export_labels(source: Positional[Path], out: Positional[Path], overwrite: bool = False) -> Path:
    """Write the label file ``source`` (OpenAI's best-of-N schema) as a Hugging Face dataset in ``out``: pairs.parquet
    (prompt/chosen/rejected), best_of_4.parquet (the labels as they are) and a dataset card naming both.

    Args:
        overwrite: replace OUT where an earlier `export labels` wrote it (only what it wrote there).
    """
    output = check_out(out, "labels", source, overwrite)
    import datasets  # seconds to import: a flag's error line never waits for it

    pairs, labels = label_rows(source, gpt2_tokenizer())
    n = sum(1 for k in labels[0] if k.startswith("sample") and not k.endswith("_tokens"))
    with write_output_dir(output) as tmp:
        datasets.Dataset.from_list(pairs).to_parquet(str(tmp / f"{PAIRS}.parquet"))
        datasets.Dataset.from_list(labels).to_parquet(str(tmp / f"{BEST_OF_N}.parquet"))
        (tmp / "README.md").write_text(DATASET_CARD.format(
            pairs=PAIRS, best_of_n=BEST_OF_N, source=Path(source).name, n=n, n_minus_1=n - 1, last=n - 1,
            n_pairs=len(pairs), n_labels=len(labels)))
    print(f"wrote {len(pairs)} pairs of {len(labels)} labels to {out}")
    return out


def export_openrlhf(reward_model: Positional[Path], out: Positional[Path], overwrite: bool = False) -> Path:
    """Write the saved reward model ``reward_model`` (any of ours, old head.pt ones too) in OpenRLHF's reward-model
    format to ``out``: the base model and a `score` Linear, and mean and std in its config, so that OpenRLHF's
    normalisation (--normalize_reward, value_head_prefix score) gives our reward exactly.

    Args:
        overwrite: replace OUT where an earlier `export openrlhf` wrote it (only what it wrote there).
    """
    output = check_out(out, "openrlhf", reward_model, overwrite)
    model, tokenizer, hparams = load_model_dir(reward_model, "reward")
    with write_output_dir(output) as tmp:
        write_model_files(tmp, model, tokenizer, hparams)
        openrlhf_config(tmp)
    print(f"wrote the OpenRLHF reward model {out}")
    return out


def main(argv: list[str] | None = None) -> Path:
    import tyro  # the command's parser: only when it runs as one

    return tyro.extras.subcommand_cli_from_dict({"labels": export_labels, "openrlhf": export_openrlhf}, args=argv,
                                                prog="python -m lm_human_preference_details.export")


if __name__ == "__main__":
    run_main(main)
