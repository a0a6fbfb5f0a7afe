"""language/cards.py: every saved model directory has a card huggingface_hub reads, with what its run was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def saved(tiny_model_dir, tiny_policy, tmp_path_factory):
    """The tiny policy and an untrained reward model saved with hparams, metrics and a W&B URL."""
    from lm_human_preference_details.language.model import RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer
    from lm_human_preference_details.queries.registry import hub_datasets  # what a run's saves pass (run/lifecycle.py)

    out = tmp_path_factory.mktemp("cards")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    policy_hparams = {"task_name": "sentiment", "base_model": "gpt2", "bf16": True, "num_ranks": 8, "update": 3,
                      "task": {"query_dataset": "bookcorpus", "query_length": 64, "response_length": 24},
                      "rewards": {"trained_model": "RUN/reward_model"}, "ppo": {"lr": 1e-5}}
    save_model_dir(out / "policy", tiny_policy, tokenizer, policy_hparams, metrics={"ppo/objective/score": 1.85},
                   tracked="https://wandb.ai/me/lm-human-preferences/runs/abc", datasets=hub_datasets(policy_hparams))
    reward_hparams = {"base_model": str(tiny_model_dir), "labels": {"source": "labels.json", "num_train": 64},
                      "task": {}, "results": {"train_reward/eval/accuracy": 0.5}}
    save_model_dir(out / "reward_model", RewardModel(load_lm(str(tiny_model_dir)), tokenizer.pad_token_id), tokenizer,
                   reward_hparams, datasets=hub_datasets(reward_hparams))
    return out


def test_policy_card_reads_back_with_its_run(saved):
    from huggingface_hub import ModelCard

    card = ModelCard.load(saved / "policy" / "README.md")
    assert card.data.base_model == "gpt2" and card.data.pipeline_tag == "text-generation"
    assert "ppo" in card.data.tags and card.data.library_name == "transformers"
    text = card.text
    for fact in ("`sentiment`", "`bookcorpus`", "64 query tokens", "saved after update 3", "RUN/reward_model",
                 "https://wandb.ai/me/lm-human-preferences/runs/abc", "| ppo/objective/score | 1.85 |", "--bf16",
                 "8 MPI ranks emulated", "bookcorpus, the public baseline's source", "pipeline('text-generation'"):
        assert fact in text, fact
    assert json.loads(text.split("```json\n")[1].split("\n```")[0])["ppo"] == {"lr": 1e-5}  # the hyperparameters


def test_reward_card_says_the_logit_is_the_reward_and_names_the_labels(saved):
    from huggingface_hub import ModelCard

    card = ModelCard.load(saved / "reward_model" / "README.md")
    assert card.data.base_model is None  # a local path is no Hub model name
    assert json.loads((saved / "reward_model" / "config.json").read_text())["reward_offset"] == 0.0
    assert "reward = model(**batch).logits[:, 0]\n" in card.text
    for fact in ("**The logit is this project's reward**", "AutoModelForSequenceClassification", "`labels.json`",
                 "64 used for training", "| train_reward/eval/accuracy | 0.5 |", "held-out accuracy logged"):
        assert fact in card.text, fact


def test_cards_front_matter_has_the_model_index_of_the_runs_results(saved):
    from huggingface_hub import ModelCard

    reward, policy = (ModelCard.load(saved / name / "README.md").data for name in ("reward_model", "policy"))
    (accuracy,) = reward.eval_results
    assert (accuracy.metric_type, accuracy.metric_value, accuracy.dataset_name) == ("accuracy", 0.5, "labels.json")
    assert [(r.metric_type, r.metric_value, r.dataset_name) for r in policy.eval_results] == [
        ("reward", 1.85, "bookcorpus")]  # the run logged a score and no KL
    # the Hub datasets its queries came from: bookcorpus's Hub id for the policy, none for a reward model's labels
    assert policy.datasets == ["bookcorpus/bookcorpus"] and reward.datasets is None


def test_no_file_of_a_saved_directory_names_this_machines_directories(saved, tiny_policy, tokenizer, tmp_path):
    """Absolute paths in the hparams become relative to the saved directory, or ~/... under the home directory; our
    loader reads them back as paths this machine opens."""
    from lm_human_preference_details.language.cards import saved_path
    from lm_human_preference_details.language.model import save_model_dir

    home = Path.home() / ".cache" / "somewhere" / "labels.json"
    (tmp_path / "base").mkdir()
    hparams = {"base_model": str(tmp_path / "base"), "output_dir": str(tmp_path / "run"), "labels": {"source": str(home)},
               "rewards": {"trained_model": str(tmp_path / "run" / "reward" / "reward_model")}, "task": {}, "ppo": {}}
    save_model_dir(tmp_path / "run" / "policy", tiny_policy, tokenizer, hparams)
    for file in (tmp_path / "run" / "policy").iterdir():
        if file.suffix in (".json", ".md", ".jinja", ".txt"):
            text = file.read_text()
            assert str(tmp_path) not in text and f"{Path.home()}/" not in text, file.name
    written = json.loads((tmp_path / "run" / "policy" / "hparams.json").read_text())
    assert written["output_dir"] == ".." and written["rewards"]["trained_model"] == "../reward/reward_model"
    assert written["labels"]["source"] == "~/.cache/somewhere/labels.json"
    assert saved_path(written["base_model"], tmp_path / "run" / "policy") == str(tmp_path / "base")
    assert saved_path(written["labels"]["source"], tmp_path) == str(home) and saved_path("gpt2", tmp_path) == "gpt2"


def test_deviations_follow_the_flags():
    from lm_human_preference_details.language.cards import deviations

    assert deviations({}) == []
    assert deviations({"tf32": True, "device": "cpu"}) == []  # no TF32 on a CPU
    assert len(deviations({"tf32": True, "device": "cuda", "bf16": True})) == 2


def test_last_metrics_keeps_each_metrics_last_value(tmp_path):
    from lm_human_preference_details.language.cards import last_metrics

    rows = [{"step": 0, "a": 1.0, "b": 2.0}, {"step": 1, "a": 3.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 2, "a"')
    assert last_metrics(tmp_path / "metrics.jsonl") == {"a": 3.0, "b": 2.0}
    assert last_metrics(tmp_path / "none.jsonl") == {}


def test_a_card_says_what_trained_the_model(tmp_path):
    """An online run's policy card says online and names the labels it collected (not the label file's count as its
    training), a combined run's names the reward model it trained, a passed one is named as passed."""
    from huggingface_hub import ModelCard

    from lm_human_preference_details.language.cards import write_card

    labels = {"source": "labels.json", "num_train": 8}
    base = {"base_model": "gpt2", "task": {"query_dataset": "q.txt", "query_length": 4, "response_length": 2}}
    runs = {
        "online": {**base, "rewards": {"trained_model": None, "train_new_model": {"labels": labels}},
                   "online": {"num_labels": 32, "labeller": "gold", "retrainings": 3}},
        "combined": {**base, "rewards": {"trained_model": None, "train_new_model": {"labels": labels}}},
        "passed": {**base, "rewards": {"trained_model": "RUN/reward/reward_model"}},
    }
    text = {}
    for name, hparams in runs.items():
        (tmp_path / name).mkdir()
        write_card(tmp_path / name, "policy", hparams)
        text[name] = ModelCard.load(tmp_path / name / "README.md").text
    assert "collected online while it trained" in text["online"] and "8 used for training" not in text["online"]
    assert "up to 32 labels in the run's `online/labels.json`, the first 8 from `labels.json`" in text["online"]
    assert "trained again up to 3 times, each time on the labels collected by then" in text["online"]
    assert "the latest retraining at each update (the run's `online/reward_KK/reward_model`)" in text["online"]
    assert "- reward model: trained in this run on the labels above (the run's `reward/reward_model`)" in text["combined"]
    assert "`labels.json` (best_of_4, 8 used for training)" in text["combined"] and "online" not in text["combined"]
    assert "- reward model: `RUN/reward/reward_model` (passed with --rewards.trained-model)" in text["passed"]
    for card in text.values():
        assert "- base model: `gpt2`" in card and "queries `q.txt`" in card
