"""OpenAI's TF checkpoints: our reader and converter against a run the original repository's own code wrote.

tests/fixtures/oai_tiny_run was made by tests/fixtures/make_oai_checkpoint.py, which imports and runs
openai/lm-human-preferences (the commit is expected.json's made_by) under tensorflow-cpu 2.21 with tf.compat.v1 shims:
its train_policy.train (reward model training first) saved the run, and its own loading code (Policy as sample.py
loads it, TrainedRewardModel as train_policy.py does) computed the logits, values, log-probs and rewards stored there.
Tolerance 1e-5 absolute: both sides compute in float32 with a different order of operations (TF's E[x^2] - E[x]^2
layer norm and -1e10 attention mask against PyTorch's); the largest difference measured is 1.5e-6 (LM
logits of size up to 3.5; rewards 1.2e-6, response log-probs 1.4e-6, values 1.2e-7).
"""

from __future__ import annotations

import functools
import http.server
import json
import shutil
import struct
import threading
from pathlib import Path

import pytest
import torch

from lm_human_preference_details.language import oai_checkpoints as oc
from lm_human_preference_details.language import tf_checkpoint as tfc
from lm_human_preference_details.language import trained_models
from lm_human_preference_details.language.model import load_model_dir
from lm_human_preference_details.utils.errors import UserError

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "oai_tiny_run"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())
TOL = 1e-5


def fixture_tokens(pad_id: int) -> torch.Tensor:
    """The fixture's tokens with its pad (n_vocab + 2, as the original's encoder) mapped to ours (FIDELITY A2)."""
    tokens = torch.tensor(EXPECTED["tokens"])
    return torch.where(tokens == EXPECTED["pad"], torch.full_like(tokens, pad_id), tokens)


def test_varint_and_protobuf_by_hand():
    assert tfc.read_varint(bytes([0xAC, 0x02]), 0) == (300, 2)
    # field 1 varint 150, field 2 bytes b"ab", field 6 fixed32 7
    message = bytes([0x08, 0x96, 0x01, 0x12, 0x02]) + b"ab" + bytes([0x35]) + struct.pack("<I", 7)
    assert tfc.proto_fields(message) == {1: [150], 2: [b"ab"], 6: [7]}


def test_block_entries_share_key_prefixes():
    # two entries: "abc" -> "1", then "abd" sharing 2 bytes -> "22"; one restart point at 0
    block = bytes([0, 3, 1]) + b"abc" + b"1" + bytes([2, 1, 2]) + b"d" + b"22" + struct.pack("<II", 0, 1)
    assert tfc.block_entries(block) == [(b"abc", b"1"), (b"abd", b"22")]


@pytest.mark.parametrize("kind", ["policy", "reward_model"])
def test_reader_lists_what_tensorflow_lists(kind):
    ckpt = tfc.TFCheckpoint(tfc.latest_checkpoint(FIXTURE / kind))
    assert ckpt.shapes() == {name: shape for name, shape in EXPECTED[kind]["variables"]}
    # train_reward.py's checkpoint holds the trained reward model; train_policy.py's the score model loaded from it
    assert ckpt.read("reward_model/reward_norm/gain") == pytest.approx(EXPECTED["reward_model"]["gain"])
    assert ckpt.read("reward_model/model/h1/attn/c_attn/w").shape == (1, 8, 24)


def test_a_big_endian_checkpoint_is_one_line(monkeypatch):
    """The index's header (BundleHeaderProto field 2, endianness: 0 little, 1 big) says how the data files are laid out;
    our reader decodes little-endian only, so a big-endian checkpoint is refused, never read as wrong numbers."""
    prefix = tfc.latest_checkpoint(FIXTURE / "policy")
    real = tfc.read_table

    def big_endian(data: bytes) -> dict:
        table = real(data)
        assert tfc.proto_fields(table[b""]).get(2, [0]) == [0]  # the fixture's, written on x86: little-endian
        return {**table, b"": bytes([0x08, 0x01, 0x10, 0x01])}  # num_shards 1, endianness 1

    monkeypatch.setattr(tfc, "read_table", big_endian)
    with pytest.raises(UserError, match=r"is big-endian; only little-endian checkpoints are supported"):
        tfc.TFCheckpoint(prefix)


def test_latest_checkpoint_follows_the_checkpoint_file():
    assert tfc.latest_checkpoint(FIXTURE / "policy") == FIXTURE / "policy" / "checkpoints" / EXPECTED["policy"]["checkpoint"]
    prefix = FIXTURE / "reward_model" / "checkpoints" / "model.ckpt"
    assert tfc.latest_checkpoint(prefix) == prefix
    with pytest.raises(UserError, match="holds no TensorFlow checkpoint"):
        tfc.latest_checkpoint(FIXTURE)


def test_hf_names():
    assert oc.hf_gpt2_name("wte") == "transformer.wte.weight"
    assert oc.hf_gpt2_name("h11/attn/c_attn/w") == "transformer.h.11.attn.c_attn.weight"
    assert oc.hf_gpt2_name("h0/ln_2/g") == "transformer.h.0.ln_2.weight"
    assert oc.hf_gpt2_name("ln_f/b") == "transformer.ln_f.bias"
    assert oc.hf_gpt2_name("h0/attn/c_attn/w/adam") is None
    assert oc.hf_gpt2_name("heads/value/w") is None
    assert oc.hf_gpt2_name("ln_1/g") is None  # a block's layer norm outside a block


def test_converted_policy_gives_the_originals_logits_values_and_logprobs(tmp_path):
    out = oc.convert_model_dir(FIXTURE / "policy", "policy", tmp_path / "policy")
    temperature = EXPECTED["task"]["policy"]["temperature"]
    policy, tokenizer, hparams = load_model_dir(out, "policy", temperature=temperature)
    assert hparams["oai_model_hparams"]["n_layer"] == 2
    tokens = fixture_tokens(tokenizer.pad_token_id)
    with torch.no_grad():  # the original's Policy.step_core: logits and values at every position
        logits, values = policy(tokens)
    torch.testing.assert_close(logits, torch.tensor(EXPECTED["policy"]["lm_logits"]), atol=TOL, rtol=0)
    torch.testing.assert_close(values, torch.tensor(EXPECTED["policy"]["values"]), atol=TOL, rtol=0)
    with torch.no_grad():  # the original's Policy.analyze_responses on the queries and sampled (pad-free) responses
        analyzed = policy.analyze_responses(tokens[:, : EXPECTED["query_length"]], torch.tensor(EXPECTED["responses"]))
    for key, value in EXPECTED["policy"]["analyze_responses"].items():
        torch.testing.assert_close(analyzed[key], torch.tensor(value), atol=TOL, rtol=0, msg=key)


def test_converted_reward_model_gives_the_originals_rewards(tmp_path):
    out = oc.convert_model_dir(FIXTURE / "reward_model", "reward", tmp_path / "reward")
    reward_model, tokenizer, _ = load_model_dir(out, "reward")
    # set by the original's reward normalisation (before and after training), then trained
    assert reward_model.gain.item() == pytest.approx(EXPECTED["reward_model"]["gain"])
    assert reward_model.bias.item() == pytest.approx(EXPECTED["reward_model"]["bias"])
    assert abs(EXPECTED["reward_model"]["gain"] - 1) > 0.1 and abs(EXPECTED["reward_model"]["bias"]) > 0.01
    tokens = fixture_tokens(tokenizer.pad_token_id)
    with torch.no_grad():  # the original's TrainedRewardModel.score_fn, and its Model's LM logits
        rewards = reward_model(tokens)
        logits = reward_model.lm_logits(reward_model.hidden(tokens))
    torch.testing.assert_close(rewards, torch.tensor(EXPECTED["reward_model"]["rewards"]), atol=TOL, rtol=0)
    torch.testing.assert_close(logits, torch.tensor(EXPECTED["reward_model"]["lm_logits"]), atol=TOL, rtol=0)


def test_policy_checkpoint_has_no_value_for_a_reward_model_scope_mixup(tmp_path):
    # train_reward.py's checkpoint holds reward_model/ and ref_policy/ scopes, no policy/
    with pytest.raises(UserError, match="no policy/model/ variables"):
        oc.convert_model_dir(FIXTURE / "reward_model", "policy", tmp_path / "x")
    assert not (tmp_path / "x").exists()


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


def test_train_policy_takes_an_oai_reward_model(tokenizer, tmp_path, monkeypatch):
    import train_policy
    from lm_human_preference_details.utils import files

    monkeypatch.setattr(files, "CACHE_DIR", tmp_path)  # where the conversion is cached
    args = train_policy.build_args("sentiment")
    args.task.query_length, args.task.response_length = EXPECTED["task"]["query_length"], EXPECTED["task"]["response_length"]
    args.rewards.trained_model = str(FIXTURE / "reward_model")
    reward_model, hparams = train_policy.get_reward_model(args, tokenizer, "cpu")
    assert hparams["converted_from"].endswith("model.ckpt")
    with torch.no_grad():
        rewards = reward_model(fixture_tokens(tokenizer.pad_token_id))
    torch.testing.assert_close(rewards, torch.tensor(EXPECTED["reward_model"]["rewards"]), atol=TOL, rtol=0)
    args.task.response_length += 1  # the run's task is checked as for our own reward models
    with pytest.raises(UserError, match="response_length"):
        train_policy.get_reward_model(args, tokenizer, "cpu")
