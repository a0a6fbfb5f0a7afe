"""FIDELITY B1-B5 (masked forward, heads, dropout, real-token sampling) and C1-C3 (sampling)."""

import contextlib
import math
from typing import Iterator

import pytest
import torch
import torch.nn.functional as F

from lm_human_preference_details.language.model import (
    Policy,
    RewardModel,
    disable_dropout,
    last_real_indices,
    load_lm,
    prepare_inputs,
)

PAD = 50257


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


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    torch.manual_seed(0)
    p = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    torch.nn.init.normal_(p.head.weight, std=0.1)  # non-zero value head so values are checked too
    return p


@contextlib.contextmanager
def packed_as(policy: Policy, packed: bool) -> Iterator[Policy]:
    """``policy`` with ``packed`` set inside the block and its default (True) back after it, whatever happens: the
    module's other tests share it."""
    policy.packed = packed
    try:
        yield policy
    finally:
        policy.packed = True


def naive_forward(lm, tokens):
    """The original's semantics done the slow way: drop the pads, run the plain LM, spread outputs back."""
    real = tokens[tokens != PAD]
    with torch.no_grad():
        h = lm.base_model(input_ids=real[None]).last_hidden_state[0]  # [n_real, d]
    out, j = [], -1
    for t in tokens.tolist():
        j += t != PAD
        out.append(h[j])
    return torch.stack(out)


def test_pads_anywhere_give_the_outputs_of_the_unpadded_sequence(policy):
    # B1 + B2: pads in the prefix/suffix gap and at the end
    tokens = torch.tensor([[464, 3290, PAD, PAD, 318, 13, PAD, 383], [40, 588, 13, 257, PAD, PAD, PAD, PAD]])
    with torch.no_grad():
        h = policy.hidden(tokens)
    for i in range(2):
        torch.testing.assert_close(h[i], naive_forward(policy.lm, tokens[i]), atol=1e-5, rtol=1e-5)
    # the output at a pad equals the last real token's output
    torch.testing.assert_close(h[1, -1], h[1, 3])


def test_packed_forward_equals_the_padded_forward_with_its_gradients(policy):
    # gpt2.py: the real tokens only, the last block only at the rows read; B1/B2 outputs and every gradient unchanged
    tokens = torch.tensor([[464, 3290, PAD, PAD, 318, 13, PAD, 383], [40, 588, 13, 257, PAD, PAD, PAD, PAD],
                           [11, 12, 13, 14, 15, 16, 17, 18]])
    read = torch.tensor([[1, 3, 7], [0, 6, 2], [7, 5, 0]])  # pads at [0, 3] and [1, 6]: B2 reads tokens 1 and 3
    weights = torch.randn(3, 3, policy.lm.config.hidden_size, generator=torch.Generator().manual_seed(0))
    params = list(policy.lm.parameters())
    assert policy.packed
    outputs, grads = [], []
    for packed in (True, False):
        with packed_as(policy, packed):
            h = policy.hidden_at(tokens, read)  # [3, 3, d]
        outputs.append(h)
        grads.append(torch.autograd.grad((h * weights).sum(), params))
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    full = policy.hidden(tokens)  # the padded forward, every position
    torch.testing.assert_close(outputs[0][0, 1], full[0, 3], atol=1e-5, rtol=1e-5)  # B2 at a pad
    torch.testing.assert_close(outputs[0][1, 1], full[1, 3], atol=1e-5, rtol=1e-5)
    for g_packed, g_padded in zip(*grads):
        torch.testing.assert_close(g_packed, g_padded, atol=1e-5, rtol=1e-4)
    assert sum(g.abs().sum() for g in grads[0]) > 0


def test_packed_reward_equals_the_padded_reward(tiny_model_dir):
    # D1 + B2: the reward at the last index is the head at the last real token, packed or not
    torch.manual_seed(0)
    model = RewardModel(load_lm(str(tiny_model_dir)), PAD)
    tokens = torch.tensor([[464, 3290, PAD, 318, 13, PAD, PAD], [40, 588, 13, 257, 11, 12, 13]])
    with torch.no_grad():
        packed = model(tokens)
        model.packed = False
        padded = model(tokens)
        by_hand = model.head(torch.stack([naive_forward(model.lm, t)[-1] for t in tokens])).squeeze(-1)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(packed, by_hand, atol=1e-5, rtol=1e-5)


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
def test_sampled_logprobs_and_values_equal_a_full_forward(policy, packed):
    # C2/C3: the sampler's log-probs (temperature-scaled) and values equal those of one forward pass
    # over [context, response], including contexts with pads in the middle and at the end
    with packed_as(policy, packed):
        torch.manual_seed(1)
        contexts = torch.tensor([
            [464, 3290, PAD, PAD, 318, 13],  # pads in the middle (query padding before a suffix)
            [40, 588, 13, PAD, PAD, PAD],  # pads at the end
            [383, 3290, 318, 257, 1049, 13],
        ])
        out = policy.sample(contexts, length=6)
        with torch.no_grad():
            analysed = policy.analyze_responses(contexts, out["responses"])
        torch.testing.assert_close(out["logprobs"], analysed["logprobs"], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out["values"], analysed["values"], atol=1e-5, rtol=1e-5)
        # and against the naive unpadded forward: log_softmax(logits / T) at the predicting positions
        for i in range(3):
            tokens = torch.cat([contexts[i], out["responses"][i]])
            h = naive_forward(policy.lm, tokens)[len(contexts[i]) - 1 : -1]
            with torch.no_grad():
                logits = policy.lm.get_output_embeddings()(h)[:, :50257] / 0.7
                values = policy.head(h).squeeze(-1)
            logprobs = F.log_softmax(logits, -1).gather(-1, out["responses"][i, :, None]).squeeze(-1)
            torch.testing.assert_close(out["logprobs"][i], logprobs, atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(out["values"][i], values, atol=1e-5, rtol=1e-5)
        # entropies: -sum p log p of the temperature-scaled distribution
        assert (analysed["entropies"] > 0).all() and (analysed["entropies"] <= math.log(50257) + 1e-4).all()


def test_packed_and_hugging_face_samplers_draw_the_same_tokens(policy):
    contexts = torch.tensor([[464, 3290, PAD, PAD, 318, 13], [40, 588, 13, PAD, PAD, PAD]])
    outs = []
    for packed in (True, False):
        with packed_as(policy, packed):
            outs.append(policy.sample(contexts, length=8, generator=torch.Generator().manual_seed(3)))
    assert torch.equal(outs[0]["responses"], outs[1]["responses"])
    torch.testing.assert_close(outs[0]["logprobs"], outs[1]["logprobs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0]["values"], outs[1]["values"], atol=1e-5, rtol=1e-5)


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


def test_analyze_responses_equals_slicing_the_full_forward(policy):
    # C3: logits[:, ctx-1:-1] / temperature from the full forward give the same numbers as the sliced head
    contexts = torch.tensor([[464, 3290, PAD, 318, 13], [40, 588, 13, PAD, PAD]])
    responses = torch.tensor([[383, 13, 257], [50256, 13, 13]])
    with torch.no_grad():
        logits, values = policy(torch.cat([contexts, responses], 1))
        out = policy.analyze_responses(contexts, responses)
    logp = F.log_softmax(logits[:, 4:-1] / 0.7, -1)
    torch.testing.assert_close(out["logprobs"], logp.gather(-1, responses[..., None]).squeeze(-1))
    torch.testing.assert_close(out["entropies"], -(logp.exp() * logp).sum(-1), atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(out["values"], values[:, 4:-1])


def test_compiled_blocks_give_the_same_numbers_and_gradients(policy, eager_and_compiled):
    # --compile: torch.compile of gpt2.block_tail (layer norm, GELU, residual adds) changes no number beyond rounding
    contexts = torch.tensor([[464, 3290, PAD, PAD, 318, 13], [40, 588, 13, PAD, PAD, PAD]])
    responses = torch.tensor([[383, 13, 257, 11], [50256, 13, 13, 40]])
    params = list(policy.lm.parameters())

    def run():
        out = policy.analyze_responses(contexts, responses)
        grads = torch.autograd.grad(out["logprobs"].sum() + out["values"].sum(), params)
        return out, grads, policy.sample(contexts, length=5, generator=torch.Generator().manual_seed(2))

    (eager, eager_grads, eager_sampled), (compiled, compiled_grads, compiled_sampled) = eager_and_compiled(run)
    for k in ("logprobs", "values"):
        torch.testing.assert_close(compiled[k], eager[k], atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert torch.equal(compiled_sampled["responses"], eager_sampled["responses"])
    torch.testing.assert_close(compiled_sampled["logprobs"], eager_sampled["logprobs"], atol=1e-5, rtol=1e-5)


def test_is_local_model_tells_paths_from_hub_names(tmp_path):
    from lm_human_preference_details.language.model_files import is_local_model

    assert not is_local_model("gpt2") and not is_local_model("openai-community/gpt2")
    for path in ("/nonexistent/model", "./gpt2", "~/models/gpt2", "a/b/c", "a/../b", str(tmp_path)):
        assert is_local_model(path), path


def test_model_files_are_checked_without_loading(tiny_model_dir, tmp_path):
    import shutil

    from lm_human_preference_details.language.model_files import check_model_files, context_length, safetensors_problem
    from lm_human_preference_details.utils.errors import UserError

    config = check_model_files(tiny_model_dir, "--base-model", "fix")
    assert context_length(config) == 256 and context_length({"max_position_embeddings": 2048}) == 2048
    assert context_length({}) is None
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    weights = copy / "model.safetensors"
    size = weights.stat().st_size
    assert safetensors_problem(weights) is None
    weights.write_bytes(weights.read_bytes()[:-1])
    assert safetensors_problem(weights) == f"{size - 1} of {size} bytes: truncated"
    with pytest.raises(UserError, match="model.safetensors is damaged .* truncated\\); save it again"):
        check_model_files(copy, "--base-model", "save it again")
    weights.unlink()
    with pytest.raises(UserError, match="has a config.json but no weights"):
        check_model_files(copy, "--base-model", "fix")
    (copy / "config.json").unlink()
    with pytest.raises(UserError, match="is not a model directory \\(it holds tokenizer files only\\)"):
        check_model_files(copy, "--base-model", "fix")


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
