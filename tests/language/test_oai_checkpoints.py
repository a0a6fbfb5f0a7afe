"""language/oai_checkpoints.py: OpenAI's TF checkpoints converted, against a run the original's own code wrote.

tests/fixtures/oai_tiny_run was made by tests/fixtures/make_oai_checkpoint.py, which imports and runs
openai/lm-human-preferences (the commit is expected.json's made_by) under tensorflow-cpu 2.21 with tf.compat.v1 shims:
its train_policy.train (reward model training first) saved the run, and its own loading code (Policy as sample.py
loads it, TrainedRewardModel as train_policy.py does) computed the logits, values, log-probs and rewards stored there.
Tolerance 1e-5 absolute: both sides compute in float32 with a different order of operations (TF's E[x^2] - E[x]^2
layer norm and -1e10 attention mask against PyTorch's); the largest difference measured is 1.5e-6 (LM
logits of size up to 3.5; rewards 1.2e-6, response log-probs 1.4e-6, values 1.2e-7).
"""

from __future__ import annotations

import pytest
import torch
from helpers.oai_run import EXPECTED, FIXTURE, TOL, fixture_tokens

from lm_human_preference_details.language import oai_checkpoints as oc
from lm_human_preference_details.language.model import load_model_dir
from lm_human_preference_details.utils.errors import UserError


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
