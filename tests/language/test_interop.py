"""language/interop.py: a saved directory read by plain transformers (a padded batch generates as each prompt alone and
as our policy's argmax; the reward model scores as ours up to the stated offset), while our own loading keeps [PAD]."""

from __future__ import annotations

import json

import pytest
import torch
from helpers.plain_hf import PROMPTS, greedy_batch_and_alone, our_argmax, plain_pairs


@pytest.fixture(scope="module")
def saved(tiny_model_dir, tiny_policy, tmp_path_factory):
    """The tiny policy and a reward model with a non-zero head bias, gain and bias, saved by save_model_dir."""
    from lm_human_preference_details.language.model import RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    out = tmp_path_factory.mktemp("saved")
    tokenizer = load_tokenizer(str(tiny_model_dir))
    torch.manual_seed(1)
    reward_model = RewardModel(load_lm(str(tiny_model_dir)), tokenizer.pad_token_id)
    with torch.no_grad():
        reward_model.head.bias.fill_(0.25), reward_model.gain.fill_(1.7), reward_model.bias.fill_(-0.4)
    save_model_dir(out / "policy", tiny_policy, tokenizer, {"task": {}, "ppo": {}})
    save_model_dir(out / "reward_model", reward_model, tokenizer, {"task": {}, "labels": {}})
    return out, reward_model


def test_saved_policy_pads_with_eos_on_the_left_in_its_tokenizer_config_and_generation_config(saved):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    out, _ = saved
    tokenizer = AutoTokenizer.from_pretrained(out / "policy")
    assert tokenizer.pad_token_id == 50256 and tokenizer.padding_side == "left" and len(tokenizer) == 50257
    assert AutoConfig.from_pretrained(out / "policy").pad_token_id == 50256
    assert GenerationConfig.from_pretrained(out / "policy").pad_token_id == 50256


def test_padded_batch_generates_as_each_prompt_alone_and_as_our_argmax(saved, tiny_policy, tokenizer):
    out, _ = saved
    together, alone = greedy_batch_and_alone(out / "policy", PROMPTS, new_tokens=6)
    assert together == alone
    assert together == our_argmax(tiny_policy, tokenizer, PROMPTS, new_tokens=6)


def test_text_generation_pipeline_runs_on_a_batch(saved):
    from transformers import pipeline

    generate = pipeline("text-generation", model=str(saved[0] / "policy"))
    texts = generate(PROMPTS, max_new_tokens=4, do_sample=False, batch_size=4)
    assert [t[0]["generated_text"].startswith(p) for t, p in zip(texts, PROMPTS)] == [True] * len(PROMPTS)


def test_our_loading_keeps_training_pad_and_the_same_tokens(saved, tokenizer):
    from lm_human_preference_details.language.model import load_model_dir

    out, _ = saved
    policy, loaded, _ = load_model_dir(out / "policy", "policy", temperature=0.7)
    assert loaded.pad_token_id == 50257 and policy.pad_id == 50257  # FIDELITY B1: training's [PAD] unchanged
    assert loaded.get_vocab() == tokenizer.get_vocab()


def test_reward_model_loads_as_sequence_classification_and_scores_as_ours_up_to_the_offset(saved, tokenizer):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from lm_human_preference_details.language.model import load_model_dir

    out, reward_model = saved
    classifier = AutoModelForSequenceClassification.from_pretrained(out / "reward_model")
    assert classifier.config.num_labels == 1 and classifier.score.bias is None
    plain = AutoTokenizer.from_pretrained(out / "reward_model")
    assert plain.padding_side == "right" and plain.pad_token_id == classifier.config.pad_token_id == 50256
    offset = json.loads((out / "reward_model" / "config.json").read_text())["reward_offset"]
    assert offset == pytest.approx(1.7 * 0.25 - 0.4)  # gain * head bias + bias
    torch.manual_seed(2)
    tokens = torch.randint(0, 50000, (6, 12))
    tokens[1, 8:], tokens[3, 5:] = 50257, 50257  # our [PAD], right after real tokens
    ids, mask = plain_pairs(tokens, 50257, 50256)
    with torch.no_grad():
        ours = reward_model(tokens)
        reloaded = load_model_dir(out / "reward_model", "reward")[0](tokens)
        theirs = classifier(input_ids=ids, attention_mask=mask).logits[:, 0]
    assert torch.equal(reloaded, ours)
    torch.testing.assert_close(theirs + offset, ours, rtol=1e-5, atol=1e-5)
    assert (theirs - ours).abs().min() > 0.01  # the offset is really there


def test_a_directory_saved_with_a_pickled_head_still_loads(saved, tiny_model_dir, tmp_path):
    import shutil

    from lm_human_preference_details.language.model import load_model_dir

    out, reward_model = saved
    old = tmp_path / "old"
    shutil.copytree(out / "reward_model", old)
    (old / "head.safetensors").unlink()
    torch.save({k: v for k, v in reward_model.state_dict().items() if not k.startswith("lm.")}, old / "head.pt")
    loaded, _, _ = load_model_dir(old, "reward")
    assert loaded.gain.item() == pytest.approx(1.7) and loaded.bias.item() == pytest.approx(-0.4)
