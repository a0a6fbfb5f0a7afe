"""The sampling command (lm_human_preference_details/sample.py) on the tiny offline assets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.errors import assert_one_error_line

from lm_human_preference_details import sample
from lm_human_preference_details.language import trained_models
from lm_human_preference_details.language.model import Policy, RewardModel, load_lm, load_model_dir, save_model_dir
from lm_human_preference_details.language.tokenizer import load_tokenizer
from lm_human_preference_details.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
TASK = ["--task.query-length", "16", "--task.response-length", "8", "--task.truncate-after", "2",
        "--task.temperature", "1.0"]


@pytest.fixture(scope="module")
def saved(assets, tmp_path_factory) -> dict[str, Path]:
    """A saved policy identical to the base model, a perturbed one, and a reward model, all on tiny-gpt2."""
    out = tmp_path_factory.mktemp("saved")
    base = str(assets / "tiny-gpt2")
    tokenizer = load_tokenizer(base)
    same = Policy(load_lm(base), tokenizer.pad_token_id, 1.0)
    save_model_dir(out / "same", same, tokenizer, {"base_model": base})
    torch.manual_seed(0)
    changed = Policy(load_lm(base), tokenizer.pad_token_id, 1.0)
    with torch.no_grad():
        changed.lm.transformer.wte.weight.mul_(3.0)  # a different output distribution
    save_model_dir(out / "changed", changed, tokenizer, {"base_model": base})
    dotty = Policy(load_lm(base), tokenizer.pad_token_id, 1.0)
    with torch.no_grad():  # the final layer norm's bias points at '.' (13): it is drawn ~14% of the time
        period = dotty.lm.transformer.wte.weight[13]
        dotty.lm.transformer.ln_f.weight.fill_(0.1)
        dotty.lm.transformer.ln_f.bias.copy_(10.0 * period / period.norm() ** 2)
    save_model_dir(out / "dotty", dotty, tokenizer, {"base_model": base})
    torch.manual_seed(1)
    save_model_dir(out / "reward", RewardModel(load_lm(base), tokenizer.pad_token_id), tokenizer,
                   {"task": {"query_length": 16, "response_length": 8}})
    return {"base": Path(base), "same": out / "same", "changed": out / "changed", "dotty": out / "dotty",
            "reward": out / "reward"}


def run(assets, tmp_path, *extra: str) -> list[dict]:
    argv = ["--task.query-dataset", str(assets / "queries.txt"), *TASK, "--device", "cpu",
            "--output-dir", str(tmp_path), *extra]
    return sample.main(argv)


def test_shapes_table_and_files(assets, saved, tmp_path, capsys):
    rows = run(assets, tmp_path, "--policy", str(saved["changed"]), "--compare", "initial",
               "--num-queries", "3", "--samples-per-query", "2")
    assert len(rows) == 2 * 3 * 2  # policies x queries x samples
    assert [r["policy"] for r in rows[:6]] == ["policy"] * 6 and [r["policy"] for r in rows[6:]] == ["initial"] * 6
    assert rows[6]["source"] == str(saved["base"])  # 'initial' = the base model recorded in the policy's hparams
    assert all(len(r["sampled_tokens"]) == 8 and len(r["query_tokens"]) == 16 for r in rows)
    assert [(r["query_index"], r["sample"]) for r in rows[:6]] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    # each query is shown once with both policies' responses under it
    table = capsys.readouterr().out
    assert table.count("query 0:") == 1 and table.count("query 2:") == 1 and "query 3:" not in table
    assert table.count("  policy  #") == 6 and table.count("  initial #") == 6
    written = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert written == rows
    assert list(tmp_path.glob("events.out.tfevents.*"))  # the TensorBoard table


def test_same_queries_and_draws_for_both_policies(assets, saved, tmp_path):
    # a saved copy of the base model against the base model itself: the same draws give the same responses
    rows = run(assets, tmp_path, "--policy", str(saved["same"]), "--compare", "initial", "--num-queries", "2")
    first, second = rows[: len(rows) // 2], rows[len(rows) // 2 :]
    assert [r["query_tokens"] for r in first] == [r["query_tokens"] for r in second]
    assert [r["response_tokens"] for r in first] == [r["response_tokens"] for r in second]
    # a different policy on the same queries answers differently
    rows = run(assets, tmp_path, "--policy", str(saved["changed"]), "--compare", str(saved["same"]), "--num-queries", "2",
               "--overwrite")  # the same output directory: replacing its samples needs the flag (docs/runs.md)
    first, second = rows[: len(rows) // 2], rows[len(rows) // 2 :]
    assert second[0]["policy"] == "compare"
    assert [r["query_tokens"] for r in first] == [r["query_tokens"] for r in second]
    assert [r["response_tokens"] for r in first] != [r["response_tokens"] for r in second]


def test_seed_determinism(assets, saved, tmp_path):
    """2 queries of 8 tokens each: a chance of 50257 ** -16 that two seeds draw the same responses."""
    a, b, c = (run(assets, tmp_path / name, "--policy", str(saved["base"]), "--seed", seed, "--num-queries", "2")
               for name, seed in (("a", "5"), ("b", "5"), ("c", "6")))
    assert a == b
    assert [r["response_tokens"] for r in a] != [r["response_tokens"] for r in c]


def test_the_draws_follow_the_seed_for_the_same_queries(saved, tokenizer):
    """sample_policy draws with a generator of its own seeded by --seed: the same contexts give the same responses
    with one seed and others with another (test_seed_determinism changes the queries too)."""
    policy, _ = trained_models.load_policy(str(saved["base"]), tokenizer, 1.0, torch.device("cpu"))
    contexts = torch.tensor([[15496, 995, 13], [40, 588, 340]])
    five, again, six = (sample.sample_policy(policy, contexts, 8, seed) for seed in (5, 5, 6))
    assert five.shape == (2, 8) and torch.equal(five, again) and not torch.equal(five, six)


def test_scores_follow_truncation_and_rejection(assets, saved, tmp_path):
    rows = run(assets, tmp_path, "--policy", str(saved["dotty"]), "--reward-model", str(saved["reward"]),
               "--num-queries", "8", "--samples-per-query", "2")
    tokenizer = load_tokenizer(str(saved["base"]))
    rm, _, _ = load_model_dir(saved["reward"], "reward")
    passed_any = failed_any = False
    for r in rows:
        tokens = r["sampled_tokens"]
        hits = [i for i, t in enumerate(tokens) if t == 13 and i >= 2]
        kept = tokens[: hits[0] + 1] if hits else tokens  # FIDELITY E2: pads after the first '.' at index >= 2
        assert r["response"] == tokenizer.decode(kept) and r["response_tokens"] == kept  # the tokens scored
        assert r["passed_filter"] == bool(hits)
        if hits:
            passed_any = True
            post = torch.tensor([kept + [tokenizer.pad_token_id] * (8 - len(kept))])
            with torch.no_grad():
                expected = rm.score(torch.tensor([r["query_tokens"]]), post).item()
            assert r["score"] == pytest.approx(expected, abs=1e-5)
        else:
            failed_any = True
            assert r["score"] == -1.0  # penalty_reward_value
    assert passed_any and failed_any


def test_bad_input_is_one_line(assets, saved, tmp_path):
    with pytest.raises(UserError, match="must be positive"):
        run(assets, tmp_path / "in-process", "--policy", str(saved["base"]), "--num-queries", "0")
    assert not (tmp_path / "in-process").exists()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run([sys.executable, "-m", "lm_human_preference_details.sample", "--policy",
                             str(tmp_path / "missing"), "--task.query-dataset", str(assets / "queries.txt"),
                             "--output-dir", str(tmp_path / "out")], capture_output=True, text=True, cwd=cwd,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}, timeout=300)
    assert_one_error_line(result, str(tmp_path / "missing"))
    assert not (tmp_path / "out").exists() and not any(cwd.iterdir())


@pytest.mark.parametrize("appears", ["file", "link"])
def test_a_samples_file_that_appears_while_sampling_is_kept(assets, saved, tmp_path, capsys, monkeypatch, appears):
    """docs/runs.md: never over a file the project did not write, never through a link, checked right before the write;
    then the same command, once the file is moved away, writes the samples."""
    from lm_human_preference_details.run.directory import MARKER
    from lm_human_preference_details.utils.errors import run_main

    out, mine = tmp_path / "out", tmp_path / "mine.jsonl"
    mine.write_text("my samples\n")
    real = sample.format_table

    def and_a_file_appears(rows, names):  # after sampling, before samples.jsonl is written
        if appears == "file":
            (out / "samples.jsonl").write_text("my samples\n")
        else:
            (out / "samples.jsonl").symlink_to(mine)
        return real(rows, names)

    monkeypatch.setattr(sample, "format_table", and_a_file_appears)
    argv = ["--task.query-dataset", str(assets / "queries.txt"), *TASK, "--device", "cpu", "--output-dir", str(out),
            "--policy", str(saved["same"]), "--num-queries", "2"]
    with pytest.raises(SystemExit) as e:
        run_main(lambda: sample.main(argv))
    line = assert_one_error_line(subprocess.CompletedProcess(argv, e.value.code, "", capsys.readouterr().err))
    assert line.startswith(f"error: {out / 'samples.jsonl'} appeared while sampling, and this run did not write it")
    assert os.listdir(out) == ["samples.jsonl"]  # our marker went: no later --overwrite takes the file for ours
    assert (out / "samples.jsonl").is_symlink() == (appears == "link") and mine.read_text() == "my samples\n"
    assert (out / "samples.jsonl").read_text() == "my samples\n"
    (out / "samples.jsonl").rename(tmp_path / "moved.jsonl")
    monkeypatch.setattr(sample, "format_table", real)
    rows = sample.main(argv)  # the same command
    assert [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()] == rows
    assert (out / MARKER).is_file()
