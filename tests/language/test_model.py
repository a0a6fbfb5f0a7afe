"""FIDELITY B1-B5 (masked forward, heads, dropout, real-token sampling) and C1-C3 (sampling)."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.models import PAD, naive_forward, packed_as

from lm_human_preference_details.language.model import (
    Policy,
    RewardModel,
    disable_dropout,
    last_real_indices,
    load_lm,
    prepare_inputs,
)


def test_prepare_inputs_by_hand():
    tokens = torch.tensor([[5, PAD, 7, PAD, PAD, 9]])
    input_ids, mask, positions = prepare_inputs(tokens, PAD)
    assert input_ids.tolist() == [[5, 0, 7, 0, 0, 9]]
    assert mask.tolist() == [[True, False, True, False, False, True]]
    # exclusive cumsum of the mask: 0, 1, 1, 2, 2, 2
    assert positions.tolist() == [[0, 1, 1, 2, 2, 2]]


def test_last_real_indices_by_hand():
    mask = torch.tensor([[True, False, True, False, False, True], [True, True, True, False, False, False]])
    assert last_real_indices(mask).tolist() == [[0, 0, 2, 2, 2, 5], [0, 1, 2, 2, 2, 2]]
    with pytest.raises(ValueError, match="starts with a pad"):
        last_real_indices(torch.tensor([[False, True]]))


def test_pads_anywhere_give_the_outputs_of_the_unpadded_sequence(tiny_policy):
    # B1 + B2: pads in the prefix/suffix gap and at the end
    tokens = torch.tensor([[464, 3290, PAD, PAD, 318, 13, PAD, 383], [40, 588, 13, 257, PAD, PAD, PAD, PAD]])
    with torch.no_grad():
        h = tiny_policy.hidden(tokens)
    for i in range(2):
        torch.testing.assert_close(h[i], naive_forward(tiny_policy.lm, tokens[i]), atol=1e-5, rtol=1e-5)
    # the output at a pad equals the last real token's output
    torch.testing.assert_close(h[1, -1], h[1, 3])


def test_head_initialisation(tiny_model_dir):
    torch.manual_seed(0)
    lm = load_lm(str(tiny_model_dir))
    d = lm.config.hidden_size
    value = Policy(lm, PAD, 1.0).head
    assert torch.count_nonzero(value.weight) == 0 and torch.count_nonzero(value.bias) == 0  # B3: value scale 0
    reward = RewardModel(lm, PAD)
    assert torch.count_nonzero(reward.head.bias) == 0
    # B3: std 1/sqrt(d + 1) = 1/sqrt(65) = 0.124; 64 draws give a sample std within ~25 %
    assert abs(reward.head.weight.std().item() - 1 / math.sqrt(d + 1)) < 0.25 / math.sqrt(d + 1)
    assert reward.gain.item() == 1.0 and reward.bias.item() == 0.0  # D1


def test_dropout_is_off_even_in_train_mode(tiny_model_dir):
    lm = load_lm(str(tiny_model_dir))
    assert lm.config.resid_pdrop == 0 and lm.config.attn_pdrop == 0 and lm.config.embd_pdrop == 0
    assert all(m.p == 0 for m in lm.modules() if isinstance(m, torch.nn.Dropout))
    model = RewardModel(lm, PAD).train()
    x = torch.tensor([[464, 3290, 318, 13]])
    assert torch.equal(model(x), model(x))  # B4: two forward passes in train mode agree exactly


def test_sampling_never_leaves_the_real_vocabulary_and_ignores_eos(tiny_model_dir):
    # a model with 3 extra embedding rows whose logits are huge: B5 must still only draw real tokens,
    # and an EOS-heavy model must still give exactly `length` tokens (C1)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    lm = disable_dropout(GPT2LMHeadModel(GPT2Config(vocab_size=50260, n_positions=64, n_embd=32, n_layer=1, n_head=2)))
    with torch.no_grad():
        lm.transformer.ln_f.weight.zero_()
        lm.transformer.ln_f.bias.fill_(1.0)  # every hidden state = ones: logits = row sums of the embedding
        lm.transformer.wte.weight[50257:] = 10.0  # ids past n_vocab would win every draw
        lm.transformer.wte.weight[50256] = 1.0  # EOS is the likeliest real token (logit 32 vs ~0)
    policy = Policy(lm, PAD, temperature=1.0)
    out = policy.sample(torch.tensor([[464, 3290, PAD], [13, 13, 13]]), length=5)
    assert out["responses"].shape == (2, 5)
    assert (out["responses"] < 50257).all()
    assert (out["responses"] == 50256).all()  # EOS sampled and sampling went on: exactly 5 tokens


@pytest.mark.parametrize("packed", [True, False])  # gpt2.py's sampler with its KV cache / Hugging Face's forward
def test_sampled_logprobs_and_values_equal_a_full_forward(tiny_policy, packed):
    # C2/C3: the sampler's log-probs (temperature-scaled) and values equal those of one forward pass
    # over [context, response], including contexts with pads in the middle and at the end
    with packed_as(tiny_policy, packed):
        torch.manual_seed(1)
        contexts = torch.tensor([
            [464, 3290, PAD, PAD, 318, 13],  # pads in the middle (query padding before a suffix)
            [40, 588, 13, PAD, PAD, PAD],  # pads at the end
            [383, 3290, 318, 257, 1049, 13],
        ])
        out = tiny_policy.sample(contexts, length=6)
        with torch.no_grad():
            analysed = tiny_policy.analyze_responses(contexts, out["responses"])
        torch.testing.assert_close(out["logprobs"], analysed["logprobs"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["values"], analysed["values"], atol=1e-5, rtol=1e-5)
        # and against the naive unpadded forward: log_softmax(logits / T) at the predicting positions
        for i in range(3):
            tokens = torch.cat([contexts[i], out["responses"][i]])
            h = naive_forward(tiny_policy.lm, tokens)[len(contexts[i]) - 1 : -1]
            with torch.no_grad():
                logits = tiny_policy.lm.get_output_embeddings()(h)[:, :50257] / 0.7
                values = tiny_policy.head(h).squeeze(-1)
            logprobs = F.log_softmax(logits, -1).gather(-1, out["responses"][i, :, None]).squeeze(-1)
            torch.testing.assert_close(out["logprobs"][i], logprobs, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out["values"][i], values, atol=1e-5, rtol=1e-5)
        # entropies: -sum p log p of the temperature-scaled distribution
        assert (analysed["entropies"] > 0).all() and (analysed["entropies"] <= math.log(50257) + 1e-4).all()


def test_reward_reads_the_last_real_token(tiny_model_dir):
    torch.manual_seed(0)
    model = RewardModel(load_lm(str(tiny_model_dir)), PAD)
    with torch.no_grad():
        model.gain.fill_(2.0)
        model.bias.fill_(0.5)
        padded = model(torch.tensor([[464, 3290, 318, PAD, PAD]]))
        unpadded = model(torch.tensor([[464, 3290, 318]]))
        head_only = model.head(model.lm.base_model(input_ids=torch.tensor([[464, 3290, 318]])).last_hidden_state[:, -1])
    torch.testing.assert_close(padded, unpadded)
    torch.testing.assert_close(padded, 2.0 * head_only.squeeze(-1) + 0.5)  # D1: gain * head + bias


def test_set_reward_norm_by_hand(tiny_model_dir):
    model = RewardModel(load_lm(str(tiny_model_dir)), PAD)
    # rewards ~ 3 +- 2 should become 0 +- 1: gain = 1/2, bias = 0 - 0.5 * 3 = -1.5
    model.set_reward_norm(old_mean=3.0, old_std=2.0, new_mean=0.0, new_std=1.0)
    assert model.gain.item() == 0.5 and model.bias.item() == -1.5
    with pytest.raises(AssertionError):
        model.set_reward_norm(old_mean=3.0, old_std=2.0, new_mean=0.0, new_std=1.0)
    model.reset_reward_scale()
    assert model.gain.item() == 1.0 and model.bias.item() == 0.0


def test_analyze_responses_equals_slicing_the_full_forward(tiny_policy):
    # C3: logits[:, ctx-1:-1] / temperature from the full forward give the same numbers as the sliced head
    contexts = torch.tensor([[464, 3290, PAD, 318, 13], [40, 588, 13, PAD, PAD]])
    responses = torch.tensor([[383, 13, 257], [50256, 13, 13]])
    with torch.no_grad():
        logits, values = tiny_policy(torch.cat([contexts, responses], 1))
        out = tiny_policy.analyze_responses(contexts, responses)
    logp = F.log_softmax(logits[:, 4:-1] / 0.7, -1)
    torch.testing.assert_close(out["logprobs"], logp.gather(-1, responses[..., None]).squeeze(-1))
    torch.testing.assert_close(out["entropies"], -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out["values"], values[:, 4:-1])


def test_saved_model_of_the_other_kind_is_named(tiny_model_dir, tmp_path):
    from lm_human_preference_details.language.model import Policy, check_saved_model, load_lm, load_model_dir, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer
    from lm_human_preference_details.utils.errors import UserError

    tokenizer = load_tokenizer(str(tiny_model_dir))
    save_model_dir(tmp_path / "policy", Policy(load_lm(str(tiny_model_dir)), tokenizer.pad_token_id, 0.7), tokenizer, {})
    # hparams that do not say (a converted OpenAI model): the head tells, when loading
    with pytest.raises(UserError, match="is a saved policy model .*not a reward model"):
        load_model_dir(tmp_path / "policy", "reward")
    (tmp_path / "policy" / "hparams.json").write_text('{"ppo": {}}')
    with pytest.raises(UserError, match=r"^--rewards.trained-model .* is a saved policy model \(train_policy.py\)"):
        check_saved_model(tmp_path / "policy", "reward", "--rewards.trained-model")
