"""The model card (README.md, a `huggingface_hub.ModelCard`) of a saved model directory: base model, task, data and
labels, the run's hyperparameters and final metrics, its W&B run, how to load it, the deviations that applied."""

from __future__ import annotations

import json
import os
from pathlib import Path

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from lm_human_preference_details.language.interop import REWARD_OFFSET
from lm_human_preference_details.language.model_files import is_local_model

CARD_FILE = "README.md"
PAPER = "https://arxiv.org/abs/1909.08593"


def deviations(hparams: dict) -> list[str]:
    """The README's differences from the original that applied to the run these ``hparams`` describe."""
    rows = []
    if hparams.get("num_ranks"):
        rows.append(f"the original's {hparams['num_ranks']} MPI ranks emulated, each with its own seed, queries and noise")
    if hparams.get("bf16"):
        rows.append("--bf16: bfloat16 autocast for the transformer's forward passes (the heads in fp32)")
    if hparams.get("tf32") and hparams.get("device") not in ("cpu", None):
        rows.append("TF32 matmuls on a CUDA device of Ampere or later (--no-tf32 for fp32)")
    task = hparams.get("task") or {}
    if any(word in str(task.get("query_dataset", "")) for word in ("bookcorpus", "tldr")):
        rows.append(f"queries from {task['query_dataset']}, the public baseline's source (OpenAI's book_passages are lost)")
    if "results" in hparams or "labels" in hparams:
        rows.append("held-out accuracy logged (train_reward/eval/accuracy): an extra metric, no effect on training")
    return rows


def provenance(kind: str, hparams: dict, labels: dict | None) -> list[str]:
    """The card's lines on what trained the model: its labels (the label file, or those an online run collected, with
    the labels each retraining used) and, for a policy, the reward model it trained against (passed, or trained in the
    run)."""
    online = hparams.get("online") or {}
    lines = []
    if online.get("num_labels"):
        first = f", the first {labels.get('num_train')} from `{labels.get('source')}`" if labels else ""
        lines.append(f"- labels: collected online while PPO trained (the paper's section 2.2), by the "
                     f"`{online.get('labeller')}` labeller: up to {online['num_labels']} labels in the run's "
                     f"`online/labels.json`{first}; the reward model was trained again up to "
                     f"{online.get('retrainings')} times, each time on the labels collected by then (the run's "
                     "`online/reward_KK/`, whose card names how many)")
    elif labels:
        lines.append(f"- labels: `{labels.get('source')}` ({labels.get('type', 'best_of_4')}, {labels.get('num_train')} "
                     "used for training)")
    if kind != "policy":
        return lines
    trained_model = (hparams.get("rewards") or {}).get("trained_model")
    if trained_model:
        lines.append(f"- reward model: `{trained_model}` (passed with --rewards.trained-model)")
    elif online.get("num_labels"):
        lines.append("- reward model: trained in this run on the labels above, the latest retraining at each update "
                     "(the run's `online/reward_KK/reward_model`)")
    elif "rewards" in hparams:
        lines.append("- reward model: trained in this run on the labels above (the run's `reward/reward_model`)")
    return lines


# the metrics a card's model-index reports (the Hub shows them): name -> (the run's metric, what it is)
INDEX_METRICS = {"reward": {"accuracy": ("train_reward/eval/accuracy", "held-out accuracy")},
                 "policy": {"reward": ("ppo/objective/score", "final score"), "kl": ("ppo/objective/kl", "final KL")}}


def model_index(kind: str, hparams: dict, shown: dict) -> dict:
    """ModelCardData's model_name and eval_results for the card's front matter (the Hub's model-index): a reward model's
    held-out accuracy on its labels, a policy's final score and KL on its queries; {} when the run logged none."""
    task = hparams.get("task") or {}
    labels = hparams.get("labels") or {}
    dataset = (str(labels.get("source") or "labels") if kind == "reward" else str(task.get("query_dataset") or "queries"))
    name = Path(dataset.rstrip("/")).name or dataset  # a name, never a machine's path
    found = [EvalResult(task_type="text-classification" if kind == "reward" else "text-generation", dataset_type=name,
                        dataset_name=name, metric_type=metric, metric_name=what, metric_value=float(shown[key]))
             for metric, (key, what) in INDEX_METRICS[kind].items() if isinstance(shown.get(key), (int, float))]
    model_name = f"{hparams.get('task_name') or 'lm-human-preferences'}-{'policy' if kind == 'policy' else 'reward-model'}"
    return {"model_name": model_name, "eval_results": found} if found else {}


def _fenced(value) -> str:
    return "```json\n" + json.dumps(value, indent=2, default=str) + "\n```"


def write_card(path: Path, kind: str, hparams: dict, *, metrics: dict | None = None, tracked: str | None = None,
               reward_offset: float | None = None, datasets: list[str] | None = None) -> None:
    """Write ``path``/README.md for a saved ``kind`` ('policy' or 'reward') model trained with ``hparams``; ``metrics``:
    the run's last logged values; ``tracked``: its W&B run URL; ``reward_offset``: the reward model's constant;
    ``datasets``: the Hub datasets its queries came from (the front matter's `datasets`)."""
    base = hparams.get("base_model")
    task = hparams.get("task") or {}
    labels = hparams.get("labels") or (((hparams.get("rewards") or {}).get("train_new_model") or {}).get("labels"))
    results = hparams.get("results")
    shown = {**(results if isinstance(results, dict) else {}), **(metrics or {})}
    data = ModelCardData(
        base_model=base if isinstance(base, str) and not is_local_model(base) else None,  # the Hub takes model names only
        library_name="transformers", license="mit",
        pipeline_tag="text-generation" if kind == "policy" else "text-classification",
        tags=["lm-human-preferences", "rlhf", "ppo" if kind == "policy" else "reward-model"],
        datasets=list(datasets) if datasets else None,
        **model_index(kind, hparams, shown),
    )
    how = " collected online while it trained" if (hparams.get("online") or {}).get("num_labels") else ""
    what = (f"A GPT-2 policy fine-tuned with PPO against a reward model learned from best-of-4 labels{how}"
            if kind == "policy" else "A GPT-2 reward model trained on best-of-4 labels (one softmax over the four "
            "samples' rewards)")
    lines = [f"# {hparams.get('task_name') or 'lm-human-preferences'}: {kind}", "",
             f"{what}, as in Ziegler et al., [Fine-Tuning Language Models from Human Preferences]({PAPER}), "
             "reproduced in PyTorch by lm-human-preference-details from "
             "[openai/lm-human-preferences](https://github.com/openai/lm-human-preferences).", "",
             f"- base model: `{base}`" if base else "- base model: unknown",
             f"- task: `{hparams.get('task_name') or 'unknown'}`, queries `{task.get('query_dataset', 'unknown')}`, "
             f"{task.get('query_length', '?')} query tokens, {task.get('response_length', '?')} response tokens"]
    lines += provenance(kind, hparams, labels)
    if "update" in hparams:
        lines.append(f"- saved after update {hparams['update']}")
    if tracked:
        lines.append(f"- W&B run: {tracked}")
    lines += ["", "## How to load it", "", "```python"]
    if kind == "policy":
        lines += ["from transformers import pipeline",
                  "generate = pipeline('text-generation', model=PATH)  # pads with <|endoftext|> on the left",
                  "print(generate('Once upon a time', max_new_tokens=24, do_sample=False))"]
    else:
        lines += ["from transformers import AutoModelForSequenceClassification, AutoTokenizer",
                  "model = AutoModelForSequenceClassification.from_pretrained(PATH)  # num_labels 1, `score` has no bias",
                  "tokenizer = AutoTokenizer.from_pretrained(PATH)",
                  "batch = tokenizer([query + response], return_tensors='pt', padding=True)  # on the right",
                  "reward = model(**batch).logits[:, 0]" + (f" + model.config.{REWARD_OFFSET}" if reward_offset else "")]
    lines += ["```", "", "This project's own code: `lm_human_preference_details.language.model.load_model_dir(PATH, "
              f"'{kind}')` (the same weights with the original's pad semantics and the head's bias)."]
    if kind == "reward":
        lines += ["", ("**The logit is this project's reward**: the reward's constant (the head's bias, the reward's gain "
                       "and bias) is folded into the final LayerNorm's bias, so `AutoModelForSequenceClassification`, "
                       "`pipeline('text-classification')` (a regression: no sigmoid), OpenRLHF, vLLM and verl read it as "
                       "it is." if not reward_offset else
                       f"**The logit differs from this project's reward by a constant**: reward = logits[:, 0] + "
                       f"`config.{REWARD_OFFSET}` = {reward_offset!r}."),
                  "Text that ends in `<|endoftext|>` (the pad of this directory) is scored at the token before it."]
    applied = deviations(hparams)
    lines += ["", "## Deviations from the original that applied", ""]
    lines += [f"- {d}" for d in applied] or ["- none of the README's table"]
    if shown:
        lines += ["", "## Final metrics", "", "| metric | value |", "|---|---|"]
        lines += [f"| {k} | {v:.6g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in sorted(shown.items())]
    lines += ["", "## Hyperparameters", "", _fenced({k: v for k, v in hparams.items() if k != "results"})]
    ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(lines) + "\n").save(path / CARD_FILE)


def last_metrics(metrics_file: Path) -> dict[str, float]:
    """The last logged value of every metric in a run's metrics.jsonl ({} if there is none)."""
    last: dict[str, float] = {}
    if metrics_file.is_file():
        for line in metrics_file.read_text().splitlines():
            try:
                row = json.loads(line)
            except ValueError:  # a row cut by a kill
                continue
            last.update({k: v for k, v in row.items() if k != "step" and isinstance(v, (int, float))})
    return last


def portable_paths(hparams: dict, where: Path) -> dict:
    """``hparams`` with each absolute path (a one-line string that starts with /) written so that no machine's directories
    are published with a model saved at ``where`` (a Hub push sends hparams.json and README.md): relative to ``where``
    within its run (RUN/reward/reward_model from RUN/policy: ../reward/reward_model), else ~/... under the home
    directory, else relative to ``where``. `saved_path` reads them back."""
    where = Path(os.path.abspath(where))
    home = Path.home()

    def portable(value):
        if isinstance(value, dict):
            return {k: portable(v) for k, v in value.items()}
        if isinstance(value, list):
            return [portable(v) for v in value]
        if not (isinstance(value, str) and os.path.isabs(value) and "\n" not in value):
            return value
        relative = os.path.relpath(value, where)
        if relative.split(os.sep)[1:2] != [os.pardir] or not Path(value).is_relative_to(home):
            return relative  # inside the run (at most one level up from the saved directory), or outside the home
        return "~/" + Path(value).relative_to(home).as_posix()

    return portable(hparams)


def saved_path(value: str, where: str | Path) -> str:
    """A path read from the hparams of the model saved at ``where`` (`portable_paths`) -> one this machine opens: ~
    expanded, a relative path that exists beside ``where`` made absolute, anything else (a model name) as it is."""
    value = os.path.expanduser(value)
    beside = os.path.normpath(os.path.join(os.path.abspath(where), value))
    return beside if not os.path.isabs(value) and os.path.exists(beside) else value
