"""language/trained_models.py: oai:NAME and OpenAI's TF runs resolved, converted once, cached and loaded."""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest
import torch
from helpers.errors import assert_one_error_line
from helpers.oai_run import EXPECTED, FIXTURE, TOL, fixture_tokens

from lm_human_preference_details.language import trained_models
from lm_human_preference_details.language.model import load_model_dir
from lm_human_preference_details.language.tokenizer import load_tokenizer
from lm_human_preference_details.utils.errors import UserError

EXPECTED_VOCAB = 40  # the fixture's tiny vocabulary (tests/fixtures/make_oai_checkpoint.py)


def test_resolve_local_directory_converts_once_and_records_the_task(tmp_path, capsys):
    first = trained_models.resolve_reward_model(str(FIXTURE / "reward_model"), cache_dir=tmp_path)
    assert "converting" in capsys.readouterr().out
    assert trained_models.resolve_reward_model(str(FIXTURE / "reward_model"), cache_dir=tmp_path) == first
    assert "converting" not in capsys.readouterr().out  # cached
    assert json.loads((Path(first) / "hparams.json").read_text())["task"]["query_length"] == EXPECTED["task"]["query_length"]
    # a checkpoint prefix works too; our own directories and model names pass through unchanged
    prefix = FIXTURE / "reward_model" / "checkpoints" / "model.ckpt"
    assert trained_models.resolve_reward_model(str(prefix), cache_dir=tmp_path) == first
    assert trained_models.resolve_reward_model("gpt2", cache_dir=tmp_path) == "gpt2"
    saved = tmp_path / "run" / "reward_model"  # what train_reward.train returns in a combined run: a Path
    assert trained_models.resolve_reward_model(saved, cache_dir=tmp_path) == str(saved)


@pytest.fixture()
def served_runs(tmp_path, monkeypatch):
    """An HTTP server on localhost serving tmp_path/runs, used as OAI_RUNS_URL."""
    root = tmp_path / "served"
    shutil.copytree(FIXTURE, root / "runs" / "tiny")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(trained_models, "OAI_RUNS_URL", f"http://127.0.0.1:{server.server_address[1]}/runs")
    yield root
    server.shutdown()
    server.server_close()


def test_oai_name_downloads_and_converts(served_runs, tmp_path):
    local = trained_models.resolve_reward_model("oai:tiny", cache_dir=tmp_path / "cache")
    reward_model, tokenizer, hparams = load_model_dir(local, "reward")
    assert hparams["task"]["response_length"] == EXPECTED["task"]["response_length"]
    with torch.no_grad():
        rewards = reward_model(fixture_tokens(tokenizer.pad_token_id))
    torch.testing.assert_close(rewards, torch.tensor(EXPECTED["reward_model"]["rewards"]), atol=TOL, rtol=0)


def test_missing_release_is_one_line_naming_the_url(served_runs, tmp_path):
    (served_runs / "runs" / "tiny" / "policy" / "checkpoints" / "checkpoint").unlink()
    with pytest.raises(UserError) as e:
        trained_models.resolve_policy("oai:tiny", cache_dir=tmp_path / "cache")
    message = str(e.value)
    assert "\n" not in message and "HTTP 404" in message
    assert f"{trained_models.OAI_RUNS_URL}/tiny/policy/checkpoints/checkpoint" in message
    assert not (tmp_path / "cache" / "oai-converted").exists()
    with pytest.raises(UserError, match="not a run name"):
        trained_models.resolve_policy("oai:../x", cache_dir=tmp_path / "cache")


def test_converted_oai_policy_reports_gpt2_as_its_initial_model(tmp_path):
    local = trained_models.resolve_policy(str(FIXTURE / "policy"), cache_dir=tmp_path)
    policy, base = trained_models.load_policy(local, load_tokenizer(local), 0.7, "cpu")
    assert base == "gpt2"  # OpenAI's policies were fine-tuned from GPT-2 124M: --compare initial loads it
    assert policy.temperature == 0.7 and policy.n_vocab == EXPECTED_VOCAB


def test_sample_on_a_run_directory_or_checkpoint_names_the_policy_to_pass(tiny_model_dir, tmp_path):
    from helpers.processes import refused_in_process

    run = tmp_path / "run"  # what train_policy.py leaves: config.json, policy/, checkpoints/update_N/state.pt
    (run / "policy").mkdir(parents=True)
    (run / "checkpoints" / "update_00000002").mkdir(parents=True)
    (run / "checkpoints" / "update_00000002" / "state.pt").write_bytes(b"")
    (run / "config.json").write_text("{}")
    reward_run = tmp_path / "reward-run"
    (reward_run / "reward_model").mkdir(parents=True)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cases = [
        (["--policy", run / "checkpoints" / "update_00000002"], f"is a training checkpoint of the run {run}, not a saved "
         f"policy; pass --policy {run / 'policy'}"),
        (["--policy", run], f"is a run directory, not a saved policy; pass --policy {run / 'policy'}"),
        (["--policy", reward_run], "is a reward model run (train_reward.py), not a policy"),
        (["--compare", run, "--policy", tiny_model_dir], f"pass --compare {run / 'policy'}"),
        ([], "--policy runs/policy_sentiment_seed1/policy does not exist (the default of --task sentiment): train one "
         "with `python train_policy.py --task sentiment`"),
    ]
    for argv, message in cases:
        result = refused_in_process("lm_human_preference_details.sample", [*argv, "--output-dir", tmp_path / "out"], cwd)
        assert_one_error_line(result, message, status=None, out=tmp_path / "out", cwd=cwd)
        assert "--base-model" not in result.stderr  # a flag sample does not have
