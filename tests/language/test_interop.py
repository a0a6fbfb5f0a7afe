"""language/interop.py: a saved directory read by plain transformers (a padded batch generates as each prompt alone and
as our policy's argmax; the reward model's plain logit is our reward), while our own loading keeps [PAD]."""

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
    save_model_dir(out / "policy", tiny_policy, tokenizer, {"task": {"response_length": 9}, "ppo": {}})
    save_model_dir(out / "reward_model", reward_model, tokenizer, {"task": {}, "labels": {}})
    return out, reward_model


def test_saved_policy_pads_with_eos_on_the_left_in_its_tokenizer_config_and_generation_config(saved):
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    out, _ = saved
    tokenizer = AutoTokenizer.from_pretrained(out / "policy")
    assert tokenizer.pad_token_id == 50256 and tokenizer.padding_side == "left" and len(tokenizer) == 50257
    assert AutoConfig.from_pretrained(out / "policy").pad_token_id == 50256
    assert GenerationConfig.from_pretrained(out / "policy").pad_token_id == 50256


def test_saved_policy_samples_as_its_task_by_default(saved):
    """generation_config.json: the softmax at the policy's temperature (0.7), no top-k or top-p, the task's length."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out, _ = saved
    config = GenerationConfig.from_pretrained(out / "policy")
    assert (config.do_sample, config.temperature, config.top_k, config.top_p, config.max_new_tokens) == (
        True, 0.7, 0, 1.0, 9)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(out / "policy"), AutoTokenizer.from_pretrained(out / "policy")
    batch = tokenizer(["The river"], return_tensors="pt")
    torch.manual_seed(0)
    with torch.no_grad():
        first = model.generate(**batch, eos_token_id=None)  # no EOS stop, as our sampler (FIDELITY C1)
        torch.manual_seed(1)
        second = model.generate(**batch, eos_token_id=None)
    assert first.shape == second.shape == (1, batch["input_ids"].shape[1] + 9) and not torch.equal(first, second)


def test_saved_tokenizers_chat_template_concatenates_as_verl_formats_prompts_and_reward_inputs(saved):
    """verl's RL data (RLHFDataset: the prompt's messages with a generation prompt) and its reward loop (the prompt's
    messages plus the response as the assistant's, no generation prompt) give our plain texts: query, query + response."""
    from transformers import AutoTokenizer

    out, _ = saved
    query, response = "An old man walked into the garden and", " sat down. <|endoftext|>"
    for kind in ("policy", "reward_model"):
        tokenizer = AutoTokenizer.from_pretrained(out / kind)
        messages = [{"role": "user", "content": query}]
        assert tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == query
        chat = [*messages, {"role": "assistant", "content": response}]
        assert tokenizer.apply_chat_template(chat, add_generation_prompt=False, tokenize=False) == query + response
        assert tokenizer(query)["input_ids"] == tokenizer.encode(query)  # plain text tokenises as before: no specials


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


def test_reward_model_is_a_regression_classifier_whose_logit_is_our_reward(saved, tokenizer):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from lm_human_preference_details.language.model import load_model_dir

    out, reward_model = saved
    config = json.loads((out / "reward_model" / "config.json").read_text())
    assert config["architectures"] == ["GPT2ForSequenceClassification"] and config["problem_type"] == "regression"
    assert config["id2label"] == {"0": "reward"} and config["reward_offset"] == 0.0
    classifier = AutoModelForSequenceClassification.from_pretrained(out / "reward_model")
    assert classifier.config.num_labels == 1 and classifier.score.bias is None
    plain = AutoTokenizer.from_pretrained(out / "reward_model")
    assert plain.padding_side == "right" and plain.pad_token_id == classifier.config.pad_token_id == 50256
    torch.manual_seed(2)
    tokens = torch.randint(0, 50000, (6, 12))
    tokens[1, 8:], tokens[3, 5:] = 50257, 50257  # our [PAD], right after real tokens
    ids, mask = plain_pairs(tokens, 50257, 50256)
    with torch.no_grad():
        ours = reward_model(tokens)
        reloaded = load_model_dir(out / "reward_model", "reward")[0](tokens)
        theirs = classifier(input_ids=ids, attention_mask=mask).logits[:, 0]
    assert torch.equal(reloaded, ours)  # our loader restores the trained final-norm bias
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-5)
    assert (1.7 * 0.25 - 0.4) > 0.01  # the constant folded in is not a rounding error


def test_text_classification_pipeline_reads_our_reward_with_and_without_function_to_apply(saved, tokenizer):
    from transformers import pipeline

    from lm_human_preference_details.language.tokenizer import encode_plain

    out, reward_model = saved
    classify = pipeline("text-classification", model=str(out / "reward_model"))
    tokens = encode_plain(tokenizer, PROMPTS)
    width = max(map(len, tokens))
    with torch.no_grad():  # right-padded with our [PAD]: read at the last real token
        ours = reward_model(torch.tensor([t + [50257] * (width - len(t)) for t in tokens])).tolist()
    for kwargs in ({"function_to_apply": "none"}, {}):  # a regression's default is none: no sigmoid
        scores = [r["score"] for r in classify(PROMPTS, **kwargs)]
        assert [r["label"] for r in classify(PROMPTS, **kwargs)] == ["reward"] * len(PROMPTS)
        assert scores == pytest.approx(ours, rel=0, abs=1e-5)


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


def test_two_saves_of_one_tokenizer_at_once_both_write_the_template_and_leave_it_as_it_was(tmp_path, monkeypatch):
    """A process reads one tokenizer per directory (`load_tokenizer`), so a policy's checkpoint and an online reward
    training may save the same one at once: each lends it the plain chat template in turn, and it keeps its own (none)."""
    import threading
    import time

    from lm_human_preference_details.language import interop
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer

    live = gpt2_tokenizer()
    save = type(live).save_pretrained

    def slow_save(self, path, **kwargs):  # a save long enough that the other thread's comes within it
        time.sleep(0.3)
        return save(self, path, **kwargs)

    monkeypatch.setattr(type(live), "save_pretrained", slow_save)
    savers = [threading.Thread(target=interop.save_plain_tokenizer, args=(live, tmp_path / name, 50257, "policy"))
              for name in ("a", "b")]
    for saver in savers:
        saver.start()
        time.sleep(0.1)
    for saver in savers:
        saver.join()
    assert live.chat_template is None
    for name in ("a", "b"):
        assert (tmp_path / name / "chat_template.jinja").read_text() == interop.PLAIN_CHAT_TEMPLATE
