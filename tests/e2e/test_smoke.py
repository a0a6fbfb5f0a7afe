"""Both scripts end to end in a subprocess on the tiny offline assets: what was logged and saved; every bad input of
both ends in one line before anything is written (in this process, and one case in a real process)."""

import contextlib
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.assets import reward_args
from helpers.errors import assert_one_error_line
from helpers.processes import in_process, refused_in_process

ROOT = Path(__file__).resolve().parents[2]


# One CPU thread in every run of this file, in its subprocesses (OMP_NUM_THREADS) and in this process (`one_thread`): the
# suite's workers already keep both cores busy, and a run's second thread only spins waiting for the first (the
# in-process runs cost about three times the CPU seconds on two threads, on a loaded 2-core VM).
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT),
       "OMP_NUM_THREADS": "1"}


pytestmark = pytest.mark.usefixtures("one_thread")  # this file's runs and sampling in this process, as ENV's


def run(script, *args, cwd=ROOT, env_extra=None):
    env = {**os.environ, **ENV, **(env_extra or {})}
    return subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], capture_output=True, text=True,
                          cwd=cwd, env=env, timeout=600)


def metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def reward_run(assets, tmp_path_factory):
    """`python train_reward.py` as a user runs it, a real process (this file's end-to-end run of it), ~6 CPU-s with its
    imports: one epoch of 4 batches of 16 labels, normalised on 64 policy samples before and after. Shared by the
    reward tests and policy_run."""
    out = tmp_path_factory.mktemp("reward") / "run"
    result = run("train_reward.py", *reward_args(assets, out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def test_reward_training_logs_and_anneals(reward_run):
    rows = metrics(reward_run)
    batches = [r for r in rows if "train_reward/minibatch/loss" in r]
    assert [r["step"] for r in batches] == [0, 1, 2, 3]  # 64 labels / 16 = 4 batches, one epoch (D3)
    for r in batches:  # D4: lr * (1 - start / num_train), start = 16 * step
        assert r["train_reward/minibatch/lr"] == pytest.approx(1e-3 * (1 - 16 * r["step"] / 64))
        assert 0 <= r["train_reward/minibatch/accuracy"] <= 1 and math.isfinite(r["train_reward/minibatch/loss"])
        assert r["train_reward/minibatch/error"] == r["train_reward/minibatch/loss"]  # as the original logs it
    assert any("train_reward/eval/accuracy" in r for r in rows)
    before = next(r for r in rows if "train_reward/normalize_before/gain" in r)
    after = next(r for r in rows if "train_reward/normalize_after/gain" in r)
    assert before["train_reward/normalize_before/gain"] != 1.0 and after["train_reward/normalize_after/gain"] != 1.0


def test_saved_reward_model_reloads_and_is_normalised(reward_run, assets):
    from lm_human_preference_details.language.model import Policy, load_lm, load_model_dir
    from lm_human_preference_details.queries import QuerySampler, format_queries, query_source

    model, tokenizer, hparams = load_model_dir(reward_run / "reward_model", "reward")
    assert hparams["task"]["query_length"] == 64 and hparams["seed"] == 3
    assert model.gain.item() != 1.0  # D8: gain and bias travel with the model
    # D7: rewards of fresh samples from the initial policy have mean ~0 and std ~1 (128 samples, other queries and noise
    # than the run's 64: mean -0.08, std 1.08 here; without normalize_after the mean is about 2)
    torch.manual_seed(123)
    policy = Policy(load_lm(str(assets / "tiny-gpt2")), tokenizer.pad_token_id, 0.7)
    sampler = QuerySampler(tokenizer, source=query_source(str(assets / "queries.txt")), query_length=64, start_text=".",
                           end_text=".", batch_size=128, seed=5)
    with torch.no_grad():
        queries = next(sampler)
        rewards = model.score(queries, policy.sample(format_queries(queries, [], []), 24)["responses"])
    assert abs(rewards.mean().item()) < 0.35
    assert 0.7 < rewards.std().item() < 1.4


def test_same_seed_same_numbers(reward_run, assets, tmp_path):
    """The subprocess's reward run again, in this process (a second subprocess would only add the imports), from other
    states of the global generators than a new interpreter's: a run that draws from them unseeded numbers differently."""
    torch.manual_seed(11), np.random.seed(11), random.seed(11)  # restore_global_generators gives them back
    torch.rand(7), np.random.rand(7), random.random()
    in_process("train_reward.py", *reward_args(assets, tmp_path / "again"))
    first, second = metrics(reward_run), metrics(tmp_path / "again")
    assert first == second


@pytest.fixture(scope="module")
def bad_inputs(assets, tmp_path_factory):
    """Directories and files that are wrong in each of the ways a user met: built once, offline."""
    import shutil

    from lm_human_preference_details.language.model import Policy, RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    d = tmp_path_factory.mktemp("bad")
    tokenizer = load_tokenizer(str(assets / "tiny-gpt2"))
    (d / "tokenizer-only").mkdir()
    tokenizer.save_pretrained(d / "tokenizer-only")
    shutil.copytree(assets / "tiny-gpt2", d / "truncated")
    weights = d / "truncated" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    lm = load_lm(str(assets / "tiny-gpt2"))
    task = {"query_length": 64, "response_length": 24}
    save_model_dir(d / "reward_model", RewardModel(lm, tokenizer.pad_token_id), tokenizer, {"task": task, "labels": {}})
    save_model_dir(d / "policy", Policy(lm, tokenizer.pad_token_id, 0.7), tokenizer, {"task": task, "ppo": {}})
    shutil.copytree(d / "reward_model", d / "reward-no-weights")
    (d / "reward-no-weights" / "model.safetensors").unlink()
    shutil.copytree(d / "reward_model", d / "reward-corrupt")
    (d / "reward-corrupt" / "head.safetensors").write_bytes(b"not a checkpoint")
    shutil.copytree(d / "reward_model", d / "reward-foreign")
    foreign = load_tokenizer(str(d / "reward-foreign"))
    foreign.add_tokens(["<extra>"])
    foreign.save_pretrained(d / "reward-foreign")
    (d / "a-file").write_text("not a directory\n")
    (d / "labels.json").write_text('[{"query": [1, 2')  # the user's own file, cut short
    records = json.loads((assets / "labels.json").read_text())
    records[5]["best"] = 7
    (d / "best-7.json").write_text(json.dumps(records))  # well-formed JSON, one value out of range
    return d


# the hub unreachable (a closed port) and HF_HUB_OFFLINE unset: one line at once, not a minute of retries.
# The hub client reads these when it is first imported, which the package does at its import: policy_bad_runs' case is
# a real process started with them (the one real process of these cases, the exit status and line as a user gets them);
# reward_bad_runs' twin runs in this process with the hub client's settings as they give them (`hub_unreachable`).
NO_NETWORK = {"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "", "HF_ENDPOINT": "http://127.0.0.1:9"}
NO_NETWORK_ERROR = ("you appear to be offline; set HF_HUB_OFFLINE=1 to use what the Hugging Face cache holds, or pass "
                    "--base-model DIR")
NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch that sees no CUDA GPU")
# Every bad input a user met, one line each. {a}: the test assets, {b}: bad_inputs.
REWARD_CASES = [
    pytest.param(["--labels.source", "{a}"], "--labels.source {a} is a directory", id="label-path-is-a-directory"),
    pytest.param(["--labels.source", "{b}/labels.json"], "fix it or pass another --labels.source", id="local-labels-bad-json"),
    pytest.param(["--labels.source", "{b}/best-7.json"], "label file {b}/best-7.json, record 5: field 'best'",
                 id="malformed-label-file"),
    pytest.param(["--batch-size", 0], "--batch-size is 0", id="batch-size-0"),
    pytest.param(["--batch-size", -16], "--batch-size is -16", id="batch-size-negative"),
    pytest.param(["--labels.num-train", 0], "--labels.num-train is 0", id="num-train-0"),
    pytest.param(["--labels.num-train", -64], "--labels.num-train is -64", id="num-train-negative"),
    pytest.param(["--micro-batch-sequences", -1], "--micro-batch-sequences is -1", id="micro-batch-sequences-negative"),
    pytest.param(["--normalize-samples", -5], "--normalize-samples is -5", id="normalize-samples-negative"),
    pytest.param(["--normalize-samples", 0], "--normalize-samples is 0", id="normalize-samples-0-is-not-off"),
    pytest.param(["--micro-batch-sequences", 6], "must be a multiple of 4: a label is 4 query-response sequences",
                 id="micro-batch-sequences-splits-a-label"),
    pytest.param(["--micro-batch-sequences", 12], "must hold a divisor of batch_size (16) rows of 4 sequence(s)",
                 id="micro-batch-sequences-not-dividing"),
    pytest.param(["--task.query-length", 240], "= 264 positions, but --base-model {a}/tiny-gpt2 has room for 256",
                 id="longer-than-context"),
    pytest.param(["--task.temperature", 0], "--task.temperature is 0", id="temperature-0"),
    pytest.param(["--base-model", "{a}"], "is not a model directory (no config.json in it)", id="base-model-not-a-model"),
    pytest.param(["--base-model", "{b}/tokenizer-only"], "holds tokenizer files only", id="base-model-tokenizer-only"),
    pytest.param(["--base-model", "{b}/truncated"], "model.safetensors is damaged", id="base-model-truncated"),
    pytest.param(["--base-model", "/nonexistent/model"], "--base-model /nonexistent/model does not exist",
                 id="base-model-missing-path"),
    pytest.param(["--device", "cuda"], "torch " + torch.__version__ + " sees: cpu", id="device-cuda-on-cpu-torch",
                 marks=NO_CUDA),
    pytest.param(["--device", "gpu"], "--device gpu is not a torch device", id="device-gpu"),
    pytest.param(["--output-dir", "{b}/a-file/run"], "lies under the file {b}/a-file", id="output-dir-under-a-file"),
    pytest.param(["--output-dir", "/proc/lmhp-run"], "--output-dir /proc/lmhp-run cannot be written",
                 id="output-dir-not-writable"),
    pytest.param(["--labels.num-train", 50], "labels.num_train (50) must be divisible by batch_size (16)", id="num-train-50"),
    pytest.param(["--task.start-text", "hello world"], "encodes to 2 tokens", id="start-text-two-tokens"),
    pytest.param(["--labels.source", "/nonexistent/labels.json"], "/nonexistent/labels.json does not exist",
                 id="labels-missing"),
    pytest.param(["--labels.source", "http://127.0.0.1:9/labels.json"], "cannot download", id="labels-unreachable-url"),
    pytest.param(["--base-model", "gpt2"], NO_NETWORK_ERROR, id="no-network"),  # gpt2: --task sentiment's base model
]


def _fill(argv, assets, bad):
    return [str(a).format(a=assets, b=bad) for a in argv]


def _runnable(params):
    """The cases not skipped here, by id (a skipped case would not be a bad input on this machine)."""
    return {p.id: p.values[0] for p in params if not any(m.name == "skipif" and m.args[0] for m in p.marks)}


@contextlib.contextmanager
def hub_unreachable():
    """The hub client's settings in this process as NO_NETWORK's environment gives them in a new one; the package's
    one check of the hub's answer (downloads.hub_reachable, cached per process) is asked afresh inside and after."""
    from huggingface_hub import constants

    from lm_human_preference_details.utils.downloads import hub_reachable

    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", NO_NETWORK["HF_ENDPOINT"])
        hub_reachable.cache_clear()
        try:
            yield
        finally:
            hub_reachable.cache_clear()


@pytest.fixture(scope="module")
def reward_bad_runs(assets, bad_inputs, tmp_path_factory):
    """Every reward case in this process (`refused_in_process`, each its own output directory), in one working
    directory, with the downloads cache in the work directory; the no-network case as `hub_unreachable` sets it."""
    work = tmp_path_factory.mktemp("reward-bad")
    (work / "cwd").mkdir()
    cases = _runnable(REWARD_CASES)
    offline = cases.pop("no-network")
    cache = {"LMHP_CACHE": work / "cache"}
    results = {key: refused_in_process("train_reward.py", reward_args(assets, work / key)
                                       + _fill(change, assets, bad_inputs), work / "cwd", cache)
               for key, change in cases.items()}
    with hub_unreachable():
        results["no-network"] = refused_in_process("train_reward.py", reward_args(assets, work / "no-network")
                                                   + offline, work / "cwd", cache)
    return work, results


@pytest.mark.parametrize("change, message", REWARD_CASES)
def test_reward_bad_input_is_one_line_and_writes_nothing(reward_bad_runs, assets, bad_inputs, change, message, request):
    work, results = reward_bad_runs
    key = request.node.callspec.id
    assert_one_error_line(results[key], message.format(a=assets, b=bad_inputs), out=work / key, cwd=work / "cwd")
    assert "delete it to download it again" not in results[key].stderr  # never said of the user's own file


# ------------------------------------------------------------------------------------ train_policy.py
F_NAMES = [
    "ppo/objective/score", "ppo/objective/score_total", "ppo/objective/kl", "ppo/objective/kl_coef",
    "ppo/objective/entropy", "ppo/ppo/loss/policy", "ppo/ppo/loss/value", "ppo/ppo/loss/total",
    "ppo/ppo/policy/entropy", "ppo/ppo/policy/approxkl", "ppo/ppo/policy/clipfrac", "ppo/ppo/returns/mean",
    "ppo/ppo/returns/var", "ppo/ppo/val/vpred", "ppo/ppo/val/error", "ppo/ppo/val/clipfrac", "ppo/ppo/val/mean",
    "ppo/ppo/val/var", "ppo/ppo/val/var_explained", "ppo/elapsed/updates", "ppo/elapsed/episodes",
    "ppo/elapsed/steps/serial", "ppo/elapsed/steps/total", "ppo/elapsed/fps", "ppo/elapsed/time",
]


def policy_args(assets, reward_dir, out):
    return ["--base-model", assets / "tiny-gpt2", "--rewards.trained-model", reward_dir,
            "--task.query-dataset", assets / "queries.txt", "--ppo.total-episodes", 48, "--ppo.batch-size", 16,
            "--num-ranks", 2, "--ppo.noptepochs", 2, "--ppo.lr", 1e-4, "--rewards.target", 0.5,
            "--sample-print-interval", 1, "--save-interval", 2, "--output-dir", out, "--device", "cpu"]


@pytest.fixture(scope="module")
def policy_run(assets, reward_run, tmp_path_factory):
    """`python train_policy.py` as a user runs it, a real process on reward_run's model, ~10 CPU-s (half of them its
    imports): 3 updates of 16 episodes, the least that shows the KL controller step twice, the second from the
    coefficient the first set."""
    out = tmp_path_factory.mktemp("policy") / "run"
    result = run("train_policy.py", *policy_args(assets, reward_run / "reward_model", out))
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_policy_logs_the_original_metrics(policy_run):
    out, result = policy_run
    rows = metrics(out)
    assert [r["step"] for r in rows] == [0, 1, 2]  # ceil(48 / 16) = 3 updates, step = update index
    for r in rows:
        assert set(F_NAMES) <= set(r), set(F_NAMES) - set(r)
        assert r["ppo/elapsed/episodes"] == 16 * (r["step"] + 1)
    for u, r in enumerate(rows):  # E8: lr * (1 - u / n_updates), constant within an update
        assert r["ppo/ppo/lr"] == pytest.approx(1e-4 * (1 - u / 3))
    assert rows[0]["ppo/objective/kl_coef"] == 0.15
    for prev, nxt in zip(rows, rows[1:]):  # E4 from the logged KL: target 0.5, horizon 10000, 16 episodes
        err = min(max(prev["ppo/objective/kl"] / 0.5 - 1, -0.2), 0.2)
        assert nxt["ppo/objective/kl_coef"] == pytest.approx(prev["ppo/objective/kl_coef"] * (1 + err * 16 / 10000))
    # the first update's rollout is on-policy: KL to the reference is ~0 before any step
    assert abs(rows[0]["ppo/objective/kl"]) < 1e-3
    assert "score =" in result.stdout and "kl =" in result.stdout  # the sample table


def test_policy_run_draws_its_curves(policy_run):
    import matplotlib.image

    out, _ = policy_run
    image = matplotlib.image.imread(out / "curves.png")  # written at each checkpoint, the last one at the end
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 4 * image.shape[0]  # four panels in a row
    assert not list(out.glob(".lmhp-tmp~*"))


def test_policy_is_saved_and_reloads(policy_run, assets):
    from transformers import AutoModelForCausalLM

    from lm_human_preference_details.language.model import load_model_dir

    out, _ = policy_run
    saved = AutoModelForCausalLM.from_pretrained(out / "policy")
    base = AutoModelForCausalLM.from_pretrained(assets / "tiny-gpt2")
    changed = [n for (n, a), b in zip(saved.named_parameters(), base.parameters()) if not torch.equal(a, b)]
    assert changed  # the policy moved
    policy, _, hparams = load_model_dir(out / "policy", "policy", temperature=0.7)
    assert hparams["ppo"]["batch_size"] == 16
    assert torch.count_nonzero(policy.head.weight) > 0  # the value head trained from its zero init
    assert not list(out.glob(".policy.*"))  # no temporary directories left behind


def test_what_the_runs_saved_works_with_plain_transformers_openrlhf_and_datasets(policy_run, reward_run, assets, tmp_path):
    """The policy and reward model these runs saved, read with plain transformers only: greedy generation on a padded
    batch equals each prompt alone and our policy's argmax; the text-generation pipeline runs; the reward model as
    AutoModelForSequenceClassification scores 16 query-response pairs as ours up to its stated offset, and its OpenRLHF
    export as ours after OpenRLHF's normalisation; every saved directory has a card; the labels load as a dataset."""
    import datasets
    from helpers.plain_hf import PROMPTS, greedy_batch_and_alone, openrlhf_rewards, our_argmax, plain_pairs
    from huggingface_hub import ModelCard
    from transformers import AutoModelForSequenceClassification, pipeline

    from lm_human_preference_details import export
    from lm_human_preference_details.label_format import OAI_PAD
    from lm_human_preference_details.language.model import load_model_dir

    out, _ = policy_run
    together, alone = greedy_batch_and_alone(out / "policy", PROMPTS, new_tokens=8)
    policy, tokenizer, _ = load_model_dir(out / "policy", "policy", temperature=0.7)
    assert together == alone == our_argmax(policy, tokenizer, PROMPTS, new_tokens=8)
    generated = pipeline("text-generation", model=str(out / "policy"))(PROMPTS, max_new_tokens=4, do_sample=False)
    assert len(generated) == len(PROMPTS)

    records = json.loads((assets / "labels.json").read_text())[:16]
    pad = tokenizer.pad_token_id
    tokens = torch.tensor([[pad if t == OAI_PAD else t for t in r["query"] + r["sample0"]] for r in records])  # [16, 88]
    reward_model, _, _ = load_model_dir(reward_run / "reward_model", "reward")
    classifier = AutoModelForSequenceClassification.from_pretrained(reward_run / "reward_model")
    ids, mask = plain_pairs(tokens, pad, classifier.config.pad_token_id)
    with torch.no_grad():
        ours = reward_model(tokens)  # [16]
        theirs = classifier(input_ids=ids, attention_mask=mask).logits[:, 0]  # the plain logit
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)
    export.main(["openrlhf", str(reward_run / "reward_model"), str(tmp_path / "openrlhf")])
    torch.testing.assert_close(openrlhf_rewards(tmp_path / "openrlhf", ids, mask), ours, rtol=1e-5, atol=1e-5)

    for saved in (out / "policy", reward_run / "reward_model", tmp_path / "openrlhf"):
        assert ModelCard.load(saved / "README.md").data.library_name == "transformers"
    last = metrics(out)[-1]["ppo/objective/score"]
    assert f"| ppo/objective/score | {last:.6g} |" in ModelCard.load(out / "policy" / "README.md").text  # final metrics
    (tmp_path / "labels.json").write_text(json.dumps(records))  # the 16 labels scored above
    export.main(["labels", str(tmp_path / "labels.json"), str(tmp_path / "labels")])
    pairs = datasets.load_dataset("parquet", data_files=str(tmp_path / "labels" / "pairs.parquet"), split="train")
    assert len(pairs) == 3 * 16  # three pairs per best-of-4 label
    assert {"prompt", "chosen", "rejected"} <= set(pairs.column_names)


POLICY_CASES = [
    pytest.param(["--ppo.batch-size", 0], "--ppo.batch-size is 0", id="ppo-batch-size-0"),
    pytest.param(["--ppo.nminibatches", 0], "--ppo.nminibatches is 0", id="nminibatches-0"),
    pytest.param(["--num-ranks", 0], "--num-ranks is 0", id="num-ranks-0"),
    pytest.param(["--ppo.noptepochs", 0], "--ppo.noptepochs is 0", id="noptepochs-0"),
    pytest.param(["--sample-print-interval", 0], "--sample-print-interval is 0", id="sample-print-interval-0"),
    pytest.param(["--save-interval", 0], "--save-interval is 0", id="save-interval-0"),
    pytest.param(["--ppo.total-episodes", 0], "--ppo.total-episodes is 0", id="total-episodes-0"),
    pytest.param(["--ppo.total-episodes", -48], "--ppo.total-episodes is -48", id="total-episodes-negative"),
    pytest.param(["--micro-batch-sequences", -1], "--micro-batch-sequences is -1", id="micro-batch-sequences-negative"),
    pytest.param(["--task.response-length", 240], "= 304 positions, but --base-model", id="longer-than-context"),
    pytest.param(["--device", "gpu"], "--device gpu is not a torch device", id="device-gpu"),
    pytest.param(["--rewards.trained-model", "{b}/policy"], "is a saved policy model (train_policy.py), not a reward model",
                 id="policy-passed-as-reward-model"),
    pytest.param(["--rewards.trained-model", "{b}/reward-no-weights"], "has a config.json but no weights",
                 id="reward-model-without-weights"),
    pytest.param(["--ppo.nminibatches", 3], "must be divisible by ppo.nminibatches (3)", id="nminibatches-3"),
    pytest.param(["--num-ranks", 8], "reward whitening groups hold 2 episodes", id="whitening-groups-of-2"),
    pytest.param(["--task.query-length", 32], "was trained with query_length 64, this run uses 32", id="query-length"),
    pytest.param(["--task.response-length", 20], "was trained with response_length 24, this run uses 20",
                 id="response-length"),
    pytest.param(["--rewards.trained-model", "/nonexistent/rm"], "is not a saved reward model directory",
                 id="reward-model-missing"),
    pytest.param(["--rewards.trained-model", "{b}/reward-corrupt"], "is corrupt", id="reward-model-corrupt"),
    pytest.param(["--rewards.trained-model", "{b}/reward-foreign"], "another tokenizer", id="reward-model-foreign-tokenizer"),
    pytest.param(["--base-model", "gpt2"], NO_NETWORK_ERROR, id="no-network"),
]


@pytest.fixture(scope="module")
def policy_bad_runs(assets, bad_inputs, tmp_path_factory):
    """Every policy case against a saved (untrained) reward model directory: in this process (`refused_in_process`),
    but the no-network case in a real process (NO_NETWORK)."""
    work = tmp_path_factory.mktemp("policy-bad")
    (work / "cwd").mkdir()
    cases = _runnable(POLICY_CASES)
    offline = cases.pop("no-network")
    results = {key: refused_in_process("train_policy.py", policy_args(assets, bad_inputs / "reward_model", work / key)
                                       + _fill(change, assets, bad_inputs), work / "cwd") for key, change in cases.items()}
    results["no-network"] = run("train_policy.py", *policy_args(assets, bad_inputs / "reward_model", work / "no-network"),
                                *offline, cwd=work / "cwd", env_extra=NO_NETWORK)
    return work, results


@pytest.mark.parametrize("change, message", POLICY_CASES)
def test_policy_bad_input(policy_bad_runs, bad_inputs, change, message, request):
    work, results = policy_bad_runs
    key = request.node.callspec.id
    assert_one_error_line(results[key], message.format(b=bad_inputs), out=work / key, cwd=work / "cwd")
    if key == "reward-model-without-weights":  # its own files are missing, not the base model's
        assert "pass --base-model" not in results[key].stderr


def test_combined_run_with_label_file_queries_and_an_unchanged_reference(assets, tmp_path, capsys):
    """oai-label-queries through PPO: the reward model trains first with its own nested options, then PPO reads the
    label file's queries too (the policy run passes its label source on); the reference model never changes while the
    policy trains. In this process: the scripts' subprocess runs are policy_run's and reward_run's."""
    import ast

    import train_policy
    from lm_human_preference_details.label_format import OAI_PAD
    from lm_human_preference_details.language.cards import saved_path
    from lm_human_preference_details.language.model import load_lm, load_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    out = tmp_path / "run"
    new = "--rewards.train-new-model."
    trained = train_policy.main([str(a) for a in (
        "--base-model", assets / "tiny-gpt2", "--task.query-dataset", "oai-label-queries",
        f"{new}labels.source", assets / "labels.json", f"{new}labels.num-train", 32, f"{new}batch-size", 16,
        f"{new}lr", 2e-3, f"{new}rollout-batch-size", 16, f"{new}normalize-samples", 16, f"{new}eval-labels", 0,
        f"{new}seed", 7, "--seed", 5, "--ppo.total-episodes", 32, "--ppo.batch-size", 16, "--num-ranks", 2,
        "--ppo.noptepochs", 1, "--sample-print-interval", 1, "--output-dir", out, "--device", "cpu")])
    stdout = capsys.readouterr().out
    _, _, hparams = load_model_dir(out / "reward" / "reward_model", "reward")
    assert hparams["seed"] == 7 and hparams["lr"] == 2e-3 and hparams["batch_size"] == 16  # the nested options
    # written relative to the saved directory (no machine's paths in what a Hub push sends: cards.portable_paths)
    source = saved_path(hparams["labels"]["source"], out / "reward" / "reward_model")
    assert source == str(assets / "labels.json") and hparams["labels"]["num_train"] == 32
    assert hparams["num_ranks"] == 2 and hparams["device"] == "cpu"  # the policy run's ranks and run options
    assert [r["step"] for r in metrics(out)] == [0, 1]  # PPO ran after the reward model
    # the policy's card says what trained it: the label file the run's reward model learned from, and that model
    card = (out / "policy" / "README.md").read_text()
    assert "- reward model: trained in this run on the labels above (the run's `reward/reward_model`)" in card
    assert "- labels: `../../../" in card and "labels.json` (best_of_4, 32 used for training)" in card
    # every query PPO printed is one of the label file's queries (pads 50259 dropped), not a local corpus text
    tokenizer = load_tokenizer(str(assets / "tiny-gpt2"))
    records = json.loads((assets / "labels.json").read_text())
    label_queries = {tokenizer.decode([t for t in r["query"] if t != OAI_PAD]) for r in records}
    lines = stdout.splitlines()
    printed = [ast.literal_eval(q) for q, nxt in zip(lines, lines[1:]) if nxt.startswith("  -> ")]
    assert printed and set(printed) <= label_queries
    # the reference policy: the base model bit for bit, its value head still zero, after 2 updates that moved the policy
    base = load_lm(str(assets / "tiny-gpt2"))
    for a, b in zip(trained["ref_policy"].lm.parameters(), base.parameters(), strict=True):
        assert torch.equal(a, b)
    assert torch.count_nonzero(trained["ref_policy"].head.weight) == 0
    assert any(not torch.equal(a, b) for a, b in zip(trained["policy"].lm.parameters(), base.parameters()))
