"""Bad input of every kind ends in one `error:` line naming the flag, a non-zero exit, and nothing written.

Values are checked in-process through Args.finalize (fast); parse errors, files read before the run and `sample` as
the scripts' main(argv) under their errors.run_main in this process (helpers.processes.refused_in_process: a process of their
own would only add torch's imports), torchrun in real processes, each in an empty working directory that must stay
empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.assets import reward_args
from helpers.errors import assert_one_error_line, one_error_line

ROOT = Path(__file__).resolve().parents[2]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(ROOT)}


# ------------------------------------------------------------------------------------------- values (finalize)
POLICY_VALUES = [
    ("ppo.lr", -1.0, "--ppo.lr is -1.0"), ("ppo.lr", 0.0, "--ppo.lr is 0.0"), ("ppo.lr", float("nan"), "--ppo.lr is nan"),
    ("ppo.lr", float("inf"), "--ppo.lr is inf"),
    ("ppo.gamma", 2.0, "--ppo.gamma is 2.0"), ("ppo.gamma", 0.0, "--ppo.gamma is 0.0"),
    ("ppo.gamma", float("nan"), "--ppo.gamma is nan"),
    ("ppo.lam", 1.5, "--ppo.lam is 1.5"), ("ppo.lam", -0.1, "--ppo.lam is -0.1"),
    ("ppo.cliprange", 0.0, "--ppo.cliprange is 0.0"), ("ppo.cliprange_value", -0.2, "--ppo.cliprange-value is -0.2"),
    ("rewards.kl_coef", -1.0, "--rewards.kl-coef is -1.0"), ("rewards.kl_coef", float("inf"), "--rewards.kl-coef is inf"),
    ("rewards.train_new_model.lr", 0.0, "--rewards.train-new-model.lr is 0.0"),
    ("task.truncate_token", -3, "--task.truncate-token is -3"),
    ("task.temperature", float("inf"), "--task.temperature is inf"),
    ("task.penalty_reward_value", float("nan"), "--task.penalty-reward-value is nan"),
    ("seed", -1, "--seed is -1"), ("seed", 2**32 - 1, "--seed is 4294967295"),
]
REWARD_VALUES = [
    ("lr", -1.0, "--lr is -1.0"), ("lr", 0.0, "--lr is 0.0"), ("lr", float("nan"), "--lr is nan"),
    ("lr", float("inf"), "--lr is inf"), ("seed", -1, "--seed is -1"),
    ("task.truncate_token", -1, "--task.truncate-token is -1"),
]


def _set(args, field: str, value) -> None:
    *path, name = field.split(".")
    target = args
    for part in path:
        target = getattr(target, part)
    setattr(target, name, value)


@pytest.mark.parametrize("script, field, value, message", [("train_policy", *case) for case in POLICY_VALUES]
                         + [("train_reward", *case) for case in REWARD_VALUES])
def test_values_the_original_would_reject_are_refused(script, field, value, message, tmp_path):
    import importlib

    from lm_human_preference_details.utils.errors import UserError

    args = importlib.import_module(script).build_args("sentiment")
    args.output_dir = str(tmp_path / "run")
    _set(args, field, value)
    with pytest.raises(UserError) as e:
        args.finalize(check_inputs=False)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_the_edges_of_each_range_are_accepted(tmp_path):
    import train_policy

    args = train_policy.build_args("sentiment")
    args.output_dir, args.seed, args.num_ranks = str(tmp_path / "run"), 2**32 - 1 - 7 * 100003, 8
    args.ppo.gamma, args.ppo.lam, args.rewards.kl_coef, args.task.truncate_token = 1.0, 0.0, 0.0, None
    args.finalize(check_inputs=False)  # gamma 1, lam 0, no KL penalty, no truncation, the largest seed: all trainable
    args = train_policy.build_args("sentiment")
    args.output_dir, args.ppo.lam, args.seed = str(tmp_path / "run"), 1.0, 0
    args.finalize(check_inputs=False)


# ------------------------------------------------------------------------- real processes: parse errors, files
@pytest.fixture(scope="module")
def bad_files(assets, tmp_path_factory) -> Path:
    """Query and label files that today are read after the run directory is written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("bad-files")
    (d / "queries.csv").write_text("text\nOnce upon a time.\n")
    (d / "no-text.jsonl").write_text('{"body": "Once upon a time."}\n')
    (d / "empty.txt").write_text("\n\n")
    pq.write_table(pa.table({"body": ["Once upon a time."]}), d / "no-text.parquet")
    records = json.loads((assets / "labels.json").read_text())
    pad_query = json.loads(json.dumps(records))
    pad_query[3]["query"] = [50259] * len(pad_query[3]["query"])  # a label whose query is all pads
    (d / "pad-query.json").write_text(json.dumps(pad_query))
    (d / "few-labels.json").write_text(json.dumps(records[:32]))
    return d


# (extra arguments, the message); {f}: bad_files
REWARD_CASES = {
    "unknown-flag": (["--bogus", "1"], "unrecognized options: --bogus, 1; run "),
    "misspelt-flag": (["--lrr", "1"], "perhaps you meant --lr"),
    "lr-not-a-number": (["--lr", "abc"], "cannot parse --lr: could not convert string to float: 'abc'"),
    "missing-value": (["--lr"], "--lr is missing its value"),
    "task-missing-value": (["--task"], "--task is missing its value; pass one of"),
    "value-after-a-switch": (["--track", "yes"], "yes (after --track, which takes no value)"),
    "truncate-token-not-a-number": (["--task.truncate-token", "abc"], "cannot parse --task.truncate-token: expected"),
    "lr-negative": (["--lr", "-1"], "--lr is -1.0"),
    "lr-nan": (["--lr", "nan"], "--lr is nan"),
    "seed-negative": (["--seed", "-1"], "--seed is -1"),
    "truncate-token-outside-vocab": (["--task.truncate-token", "99999"], "--task.truncate-token is 99999, but --base-model"),
    "csv-query-file": (["--task.query-dataset", "{f}/queries.csv"], "unknown file type '.csv'"),
    "jsonl-without-text": (["--task.query-dataset", "{f}/no-text.jsonl"], "line 1: expected a JSON string or an object"),
    "parquet-without-text": (["--task.query-dataset", "{f}/no-text.parquet"], "has no column 'text' (columns: body)"),
    "query-file-without-texts": (["--task.query-dataset", "{f}/empty.txt"], "holds no texts"),
    "label-query-all-pads": (["--labels.source", "{f}/pad-query.json"], "record 3: field 'query' starts with the pad 50259"),
    "labels-best-of-1": (["--labels.type", "best_of_1"], "labels.type 'best_of_1' is not supported; use best_of_N, N >= 2"),
    "labels-not-best-of": (["--labels.type", "pairwise"], "labels.type 'pairwise' is not supported"),
    "too-few-labels": (["--labels.source", "{f}/few-labels.json"], "holds 32 labels but --labels.num-train is 64"),
}


@pytest.fixture(scope="module")
def reward_results(assets, bad_files, tmp_path_factory):
    from helpers.processes import refused_in_process

    work = tmp_path_factory.mktemp("reward-bad-input")
    (work / "cwd").mkdir()
    return work, {key: refused_in_process("train_reward.py", reward_args(assets, work / "out" / key)
                                          + [str(a).format(f=bad_files) for a in change], work / "cwd",
                                          {"LMHP_CACHE": work / "cache"})
                  for key, (change, _) in REWARD_CASES.items()}


@pytest.mark.parametrize("key", REWARD_CASES)
def test_reward_bad_input_is_one_line_before_anything_is_written(reward_results, key):
    work, results = reward_results
    assert_one_error_line(results[key], REWARD_CASES[key][1], status=None, out=work / "out" / key, cwd=work / "cwd")


def test_policy_parse_errors_and_values_are_one_line(assets, tmp_path):
    from helpers.processes import refused_in_process

    base = ["--base-model", assets / "tiny-gpt2", "--task.query-dataset", assets / "queries.txt", "--device", "cpu"]
    cases = {"lr-not-a-number": (["--ppo.lr", "abc"], "cannot parse --ppo.lr"),
             "lr-nan": (["--ppo.lr", "nan"], "--ppo.lr is nan"),
             "gamma-2": (["--ppo.gamma", "2"], "--ppo.gamma is 2.0"),
             "kl-coef-negative": (["--rewards.kl-coef", "-1"], "--rewards.kl-coef is -1.0")}
    (tmp_path / "cwd").mkdir()
    for key, (change, message) in cases.items():
        result = refused_in_process("train_policy.py", base + ["--output-dir", tmp_path / "out" / key] + change,
                                    tmp_path / "cwd")
        assert_one_error_line(result, message, status=None, out=tmp_path / "out" / key, cwd=tmp_path / "cwd")


def test_torchrun_prints_the_error_once(assets, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(ROOT / "train_reward.py"), *map(str, reward_args(assets, tmp_path / "out")), "--lr", "-1"],
                            capture_output=True, text=True, cwd=cwd, env={**os.environ, **ENV}, timeout=600)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert result.returncode != 0
    assert errors == ["error: --lr is -1.0, but it is the initial learning rate and must be a finite number > 0; pass a "
                      "positive --lr"], result.stderr[-3000:]
    assert "train_reward.py\", line" not in result.stderr  # torchrun's own ChildFailedError block, no traceback of ours
    assert not (tmp_path / "out").exists() and not any(cwd.iterdir())


# ------------------------------------------------------------------------------ paths and models, checked in-process


def test_an_output_dir_that_is_not_utf8_is_one_line_before_anything_is_written(assets, tmp_path, capsys, monkeypatch):
    import train_policy
    import train_reward
    from lm_human_preference_details import sample

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    out = os.fsdecode(bytes(tmp_path / "run") + b"\xff\xfe")  # a name made with bytes that are not UTF-8
    data = ["--task.query-dataset", assets / "queries.txt", "--device", "cpu"]
    for main, argv in [(train_reward.main, reward_args(assets, out)),
                       (train_policy.main, ["--base-model", assets / "tiny-gpt2", *data, "--output-dir", out]),
                       (sample.main, ["--policy", assets / "tiny-gpt2", *data, "--output-dir", out])]:
        line = one_error_line(capsys, main, argv)
        assert line == (f"error: --output-dir {tmp_path}/run\\xff\\xfe is not UTF-8 text (config.json, TensorBoard and "
                        "W&B store the path as text); pass a path whose name is UTF-8")
        assert sorted(os.listdir(tmp_path)) == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine"


@pytest.fixture(scope="module")
def foreign_models(assets, tmp_path_factory) -> dict[str, Path]:
    """Hugging Face models that cannot be our policy or base model, each beside the GPT-2 tokenizer's files: a GPT-2 of
    1000 tokens, a GPT-2 of 20 positions (fewer than query + response), a BERT of GPT-2's vocabulary."""
    import shutil

    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    out = tmp_path_factory.mktemp("foreign-models")
    small = {"n_embd": 16, "n_layer": 1, "n_head": 2}
    models = {"vocab-1000": GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=64, **small)),
              "20-positions": GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_positions=20, **small)),
              "bert": BertForMaskedLM(BertConfig(vocab_size=50257, hidden_size=16, num_hidden_layers=1,
                                                 num_attention_heads=2, intermediate_size=32))}
    for name, model in models.items():
        model.save_pretrained(out / name)
        for tokenizer_file in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(assets / "tiny-gpt2" / tokenizer_file, out / name / tokenizer_file)
    return {name: out / name for name in models}


FOREIGN = {"vocab-1000": "has 1000 tokens, but the GPT-2 tokenizer gives ids up to 50256, which it has no embedding for; "
                         "pass a model with GPT-2's 50257 tokens",
           "20-positions": "= 88 positions, but {flag} {model} has room for 20; lower --task.query-length",
           "bert": "is a BertForMaskedLM, not a causal language model; pass a GPT-2"}


@pytest.mark.parametrize("model", FOREIGN)
def test_a_model_that_cannot_be_our_policy_is_one_line_in_every_tool(assets, foreign_models, model, tmp_path, capsys,
                                                                     monkeypatch):
    import train_policy
    import train_reward
    from lm_human_preference_details import label, sample

    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    path, out = foreign_models[model], tmp_path / "out"
    data = ["--task.query-dataset", assets / "queries.txt", "--device", "cpu"]  # sentiment's 64 + 24 positions
    tiny, new = assets / "tiny-gpt2", "--rewards.train-new-model."
    reward_run = [f"{new}labels.source", assets / "labels.json", f"{new}labels.num-train", 16, f"{new}batch-size", 8,
                  f"{new}rollout-batch-size", 8, f"{new}normalize-samples", 8, f"{new}eval-labels", 0]  # RUN/reward's
    for main, flag, argv in [
            (sample.main, "--policy", ["--policy", path, *data, "--output-dir", out]),
            (label.main, "--policy", ["--policy", path, "--base-model", tiny, *data, "--output", out, "--port", 0]),
            (train_policy.main, "--base-model", ["--base-model", path, *data, *reward_run, "--output-dir", out]),
            (train_reward.main, "--base-model", [*reward_args(assets, out), *data, "--base-model", path])]:
        line = one_error_line(capsys, main, argv)
        assert FOREIGN[model].format(flag=flag, model=path) in line and f"{flag} {path}" in line, line
        assert sorted(os.listdir(tmp_path)) == ["notes.txt"] and (tmp_path / "notes.txt").read_text() == "mine"


