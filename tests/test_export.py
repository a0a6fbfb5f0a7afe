"""export.py: a label file as a Hugging Face dataset (three prompt/chosen/rejected pairs per best-of-4 label, and the
labels as they are), and a reward model in OpenRLHF's format that OpenRLHF's loading reads as our reward."""

from __future__ import annotations

import json
import math

import pytest
import torch
from helpers.errors import assert_one_error_line
from helpers.plain_hf import openrlhf_rewards, plain_pairs
from helpers.processes import refused_in_process

LABELS = [{"query": [464, 7850, 50259], "sample0": [13, 50259], "sample1": [290, 13], "sample2": [257, 50259],
           "sample3": [262, 1110], "best": 1},
          {"query": [32, 3797, 318], "sample0": [1110, 13], "sample1": [13, 13], "sample2": [262, 50259],
           "sample3": [290, 50259], "best": 3}]


def test_labels_become_three_pairs_per_label_and_the_best_of_4_schema(tmp_path, tokenizer):
    import datasets

    from lm_human_preference_details import export

    (tmp_path / "labels.json").write_text(json.dumps(LABELS))
    export.main(["labels", str(tmp_path / "labels.json"), str(tmp_path / "out")])
    # the folder with its card's configurations; a cache of its own: datasets caches a folder by its name
    pairs = datasets.load_dataset(str(tmp_path / "out"), "pairs", split="train", cache_dir=str(tmp_path / "cache"))
    text = tokenizer.decode
    assert pairs.to_list()[:3] == [  # label 0: sample 1 against samples 0, 2 and 3, pads 50259 left out
        {"prompt": text([464, 7850]), "chosen": text([290, 13]), "rejected": text(rejected), "label": 0,
         "chosen_sample": 1, "rejected_sample": j} for j, rejected in ((0, [13]), (2, [257]), (3, [262, 1110]))]
    assert len(pairs) == 6 and [r["chosen"] for r in pairs.to_list()[3:]] == [text([290])] * 3
    labels = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "best_of_4.parquet"), split="train")
    assert labels["best"] == [1, 3] and labels["sample2_tokens"][1] == [262, 50259]  # the file's tokens as they are
    assert labels["query"][0] == text([464, 7850])
    tokens = datasets.load_dataset(str(tmp_path / "out"), "pair_tokens", split="train", cache_dir=str(tmp_path / "cache"))
    assert tokens.to_list()[:3] == [  # query + sample as labelled, pads left out, no EOS
        {"chosen_ids": [464, 7850, 290, 13], "rejected_ids": [464, 7850, *rejected], "prompt_length": 2, "label": 0,
         "chosen_sample": 1, "rejected_sample": j} for j, rejected in ((0, [13]), (2, [257]), (3, [262, 1110]))]
    assert tokens["chosen_ids"][3:] == [[32, 3797, 318, 290]] * 3


def test_the_dataset_card_has_the_hubs_metadata_and_the_license_given(tmp_path):
    from huggingface_hub import DatasetCard

    from lm_human_preference_details import export

    (tmp_path / "labels.json").write_text(json.dumps(LABELS))
    export.main(["labels", str(tmp_path / "labels.json"), str(tmp_path / "mit")])
    export.main(["labels", str(tmp_path / "labels.json"), str(tmp_path / "cc"), "--license", "cc-by-4.0"])
    card = DatasetCard.load(tmp_path / "mit" / "README.md").data
    assert (card.license, card.language, card.size_categories) == ("mit", ["en"], ["n<1K"])
    assert set(card.task_categories) == {"text-classification", "text-generation"}
    assert [c["config_name"] for c in card.configs] == ["pairs", "pair_tokens", "best_of_4"]
    assert DatasetCard.load(tmp_path / "cc" / "README.md").data.license == "cc-by-4.0"
    assert export.size_category(999) == "n<1K" and export.size_category(8192) == "1K<n<10K"


def test_a_gzipped_label_file_exports_as_the_plain_one_and_the_packages_own_reads(tmp_path):
    import gzip

    import datasets

    from lm_human_preference_details import export
    from lm_human_preference_details.label_format import read_records
    from lm_human_preference_details.offline.assets import SHIPPED

    (tmp_path / "labels.json").write_text(json.dumps(LABELS))
    (tmp_path / "labels.json.gz").write_bytes(gzip.compress((tmp_path / "labels.json").read_bytes()))
    for name in ("labels.json", "labels.json.gz"):
        export.main(["labels", str(tmp_path / name), str(tmp_path / f"out-{name}")])
    plain, gzipped = (datasets.load_dataset("parquet", data_files=str(tmp_path / f"out-{name}" / "pairs.parquet"),
                                            split="train").to_list() for name in ("labels.json", "labels.json.gz"))
    assert plain == gzipped and len(plain) == 6
    assert len(read_records(SHIPPED / "labels.json.gz")) > 1000  # the offline task's labels, as the package ships them


def test_a_bad_label_file_is_one_line(tmp_path):
    (tmp_path / "labels.json").write_text(json.dumps([{**LABELS[0], "best": 4}]))
    (tmp_path / "cwd").mkdir()
    result = refused_in_process("lm_human_preference_details.export", ["labels", tmp_path / "labels.json",
                                                                         tmp_path / "out"], tmp_path / "cwd")
    assert_one_error_line(result, "field 'best' must be an int in 0..3, got 4", out=tmp_path / "out", cwd=tmp_path / "cwd")


def test_openrlhf_loads_a_saved_reward_model_and_its_export_and_reads_our_reward(tiny_model_dir, tmp_path):
    from lm_human_preference_details import export
    from lm_human_preference_details.language.model import RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    torch.manual_seed(0)
    reward_model = RewardModel(load_lm(str(tiny_model_dir)), tokenizer.pad_token_id)
    with torch.no_grad():
        reward_model.head.bias.fill_(-0.5), reward_model.gain.fill_(0.8), reward_model.bias.fill_(2.0)
    save_model_dir(tmp_path / "reward_model", reward_model, tokenizer, {"labels": {}})
    export.main(["openrlhf", str(tmp_path / "reward_model"), str(tmp_path / "openrlhf")])
    config = json.loads((tmp_path / "openrlhf" / "config.json").read_text())
    assert not config["normalize_reward"] and config["value_head_prefix"] == "score"
    assert config["mean"] == 0.0 and config["std"] == 1.0  # an identity, should its normalisation be switched on
    tokens = torch.randint(0, 50000, (5, 10))
    tokens[0, 7:] = tokenizer.pad_token_id
    ids, mask = plain_pairs(tokens, tokenizer.pad_token_id, tokenizer.eos_token_id)
    with torch.no_grad():
        ours = reward_model(tokens)
    # OpenRLHF's default, normalisation off: with it on, transformers 5 leaves its non-persistent mean and std buffers
    # uninitialised (OpenRLHF/OpenRLHF#1343), whatever the config says
    for path in (tmp_path / "reward_model", tmp_path / "openrlhf"):
        torch.testing.assert_close(openrlhf_rewards(path, ids, mask), ours, rtol=0, atol=1e-5)


def test_each_label_of_several_labellers_is_a_row_with_its_labeller_and_pairs_follow_the_training_choice(tmp_path):
    import datasets

    from lm_human_preference_details import export

    named = [{**LABELS[0], "best": 1, "labeller": "ann",
              "labels": [{"labeller": "ann", "best": 1}, {"labeller": "bob", "best": 2}]},
             {**LABELS[1], "labeller": "bob", "labels": [{"labeller": "bob", "best": 3}]}]
    (tmp_path / "labels.json").write_text(json.dumps(named))
    export.main(["labels", str(tmp_path / "labels.json"), str(tmp_path / "out")])
    labels = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "best_of_4.parquet"), split="train")
    assert [(r["label"], r["labeller"], r["best"], r["trains"]) for r in labels] == [
        (0, "ann", 1, True), (0, "bob", 2, False), (1, "bob", 3, True)]
    pairs = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "pairs.parquet"), split="train")
    assert [(r["label"], r["chosen_sample"]) for r in pairs] == [(0, 1)] * 3 + [(1, 3)] * 3  # ann's 1 trains, not bob's 2


def test_out_is_written_only_where_nothing_of_anyone_else_is_and_every_file_stays(tmp_path):
    """OUT goes through the gate of every output (utils/outputs.py): a run, the label file's own directory, a directory
    of yours, a file, `.` and `..`, a path under a file or inside the input are each one line before anything is read,
    with every file as it was; an export's own OUT is replaced with --overwrite only, and never over a file of yours."""
    from helpers.labelling import snapshot

    run, proj = tmp_path / "run", tmp_path / "proj"
    (run / "reward" / "reward_model").mkdir(parents=True)
    (run / ".lmhp-run.json").write_text('{"kind": "policy", "id": "x"}')
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "state.pt").write_bytes(b"weights")
    (run / "reward" / "reward_model" / "config.json").write_text("{}")
    (proj / "sub").mkdir(parents=True)
    (tmp_path / "cwd").mkdir()
    (proj / "labels.json").write_text(json.dumps(LABELS))
    (proj / "notes.md").write_text("mine")
    cases = [(["openrlhf", run / "reward" / "reward_model", run], "holds a policy run, and this is an openrlhf export"),
             (["labels", proj / "labels.json", proj], "holds files that are not an export of this project"),
             (["labels", proj / "labels.json", proj / "notes.md"], "is a file; pass a directory"),
             (["labels", proj / "labels.json", "."], "holds the current directory"),
             (["labels", proj / "labels.json", ".."], "holds the current directory"),
             (["labels", proj / "labels.json", proj / "labels.json" / "out"], "lies under the file"),
             (["openrlhf", run / "reward" / "reward_model", run / "reward" / "reward_model" / "x"],
              "lies inside, the input"),
             (["labels", proj / "missing.json", tmp_path / "new"], "pass SOURCE a label file")]
    before = snapshot(tmp_path)
    for argv, message in cases:
        cwd = proj / "sub" if argv[-1] in (".", "..") else tmp_path / "cwd"
        result = refused_in_process("lm_human_preference_details.export", argv, cwd)
        line = assert_one_error_line(result, message)
        assert "--labels.source" not in line
        assert snapshot(tmp_path) == before, argv
    out = tmp_path / "out"
    argv = ["labels", proj / "labels.json", out]
    refused_in_process("lm_human_preference_details.export", argv, tmp_path / "cwd")
    first = snapshot(out)
    assert {"pairs.parquet", "pair_tokens.parquet", "best_of_4.parquet", "README.md", ".lmhp-output.json"} == set(first)
    assert_one_error_line(refused_in_process("lm_human_preference_details.export", argv, tmp_path / "cwd"),
                          "already holds a labels export; pass --overwrite")
    (proj / "labels.json").write_text(json.dumps(LABELS[:1]))
    assert refused_in_process("lm_human_preference_details.export", [*argv, "--overwrite"], tmp_path / "cwd").returncode == 0
    assert snapshot(out)["pairs.parquet"] != first["pairs.parquet"]  # replaced, one label now
    (out / "mine.txt").write_text("a note of yours")
    before = snapshot(tmp_path)
    for argv, message in [([*argv, "--overwrite"], "holds 'mine.txt', which this project did not write there"),
                          (["openrlhf", run / "reward" / "reward_model", out, "--overwrite"],
                           "holds a labels export, and this is an openrlhf export")]:
        assert_one_error_line(refused_in_process("lm_human_preference_details.export", argv, tmp_path / "cwd"), message)
        assert snapshot(tmp_path) == before


def test_verl_rl_data_is_the_tasks_queries_as_one_user_message_each(tmp_path, monkeypatch, tokenizer):
    import datasets

    from lm_human_preference_details import export
    from lm_human_preference_details.utils import files

    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")  # the offline task's assets, built for this test
    export.main(["verl", "offline", str(tmp_path / "verl"), "--num-queries", "5", "--mode", "test"])
    rows = datasets.load_dataset("parquet", data_files=str(tmp_path / "verl" / "test.parquet"), split="train").to_list()
    assert len(rows) == 5 and {r["data_source"] for r in rows} == {"lm-human-preferences/offline"}
    assert {(r["reward_model"]["style"], r["ability"]) for r in rows} == {("model", "lm-human-preferences")}
    assert [r["extra_info"]["index"] for r in rows] == list(range(5)) and rows[0]["extra_info"]["split"] == "test"
    for row in rows:
        (message,) = row["prompt"]
        tokens = row["extra_info"]["query_tokens"]
        assert message["role"] == "user" and message["content"] == tokenizer.decode(tokens)
        assert 0 < len(tokens) <= 64 and 50257 not in tokens  # the offline task's query length, pads left out


@pytest.fixture
def trl_run(tmp_path):
    """What TRL's trainers take on a CPU for a few steps in fp32 (TRL defaults to bf16), saving nothing: ->
    TrainingArguments' keywords."""
    return {"output_dir": str(tmp_path / "trl"), "max_steps": 2, "logging_steps": 1, "report_to": [], "use_cpu": True,
            "save_strategy": "no", "learning_rate": 1e-3, "bf16": False, "dataloader_num_workers": 0, "disable_tqdm": True,
            "seed": 0}


def test_trls_reward_trainer_reads_our_reward_on_the_labelled_tokens_and_trains(tiny_model_dir, tmp_path, trl_run):
    """RewardTrainer on a saved reward model and `pair_tokens`: its first step's rewards (all six pairs in one batch,
    before any update) are ours on the same tokens, then two steps train."""
    import datasets
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from trl import RewardConfig, RewardTrainer

    from lm_human_preference_details import export
    from lm_human_preference_details.language.model import RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_model_dir))
    torch.manual_seed(3)
    reward_model = RewardModel(load_lm(str(tiny_model_dir)), tokenizer.pad_token_id)
    with torch.no_grad():
        reward_model.head.bias.fill_(0.3), reward_model.gain.fill_(1.5), reward_model.bias.fill_(-1.0)
    save_model_dir(tmp_path / "reward_model", reward_model, tokenizer, {"labels": {}})
    (tmp_path / "labels.json").write_text(json.dumps(LABELS))
    export.main(["labels", str(tmp_path / "labels.json"), str(tmp_path / "out")])
    pairs = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "pair_tokens.parquet"), split="train")
    with torch.no_grad():
        ours = torch.cat([reward_model(torch.tensor([ids])) for ids in [*pairs["chosen_ids"], *pairs["rejected_ids"]]])
    trainer = RewardTrainer(model=AutoModelForSequenceClassification.from_pretrained(tmp_path / "reward_model"),
                            args=RewardConfig(**trl_run, per_device_train_batch_size=len(pairs)), train_dataset=pairs,
                            processing_class=AutoTokenizer.from_pretrained(tmp_path / "reward_model"))
    trainer.train()
    first, second = trainer.state.log_history[:2]
    assert first["min_reward"] == pytest.approx(ours.min().item(), abs=1e-5)
    assert first["max_reward"] == pytest.approx(ours.max().item(), abs=1e-5)
    assert first["mean_reward"] == pytest.approx(ours.mean().item(), abs=1e-5)
    assert second["loss"] < first["loss"] and trainer.state.global_step == 2


def test_trls_dpo_trainer_trains_the_offline_tasks_tiny_gpt2_on_exported_pairs(tmp_path, monkeypatch, trl_run):
    """DPOTrainer on the text pairs, with the offline task's tiny GPT-2 as docs/offline.md offers it: its tokenizer
    pads with a token the model embeds (TRL pads with the tokenizer's pad)."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    from lm_human_preference_details import export
    from lm_human_preference_details.offline.assets import ensure_offline_assets
    from lm_human_preference_details.utils import files

    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    tiny = ensure_offline_assets() / "tiny-gpt2"
    (tmp_path / "labels.json").write_text(json.dumps(LABELS))
    export.main(["labels", str(tmp_path / "labels.json"), str(tmp_path / "out")])
    pairs = datasets.load_dataset("parquet", data_files=str(tmp_path / "out" / "pairs.parquet"), split="train")
    trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny), train_dataset=pairs,
                         args=DPOConfig(**trl_run, per_device_train_batch_size=3),
                         processing_class=AutoTokenizer.from_pretrained(tiny))
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses) and trainer.state.global_step == 2
