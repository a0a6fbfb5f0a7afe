"""language/gpt2.py: the packed forward, its KV-cache sampler and --compile's blocks against the padded forward."""

import torch
from helpers.models import PAD, naive_forward, packed_as

from lm_human_preference_details.language.model import RewardModel, load_lm


def test_packed_forward_equals_the_padded_forward_with_its_gradients(tiny_policy):
    # gpt2.py: the real tokens only, the last block only at the rows read; B1/B2 outputs and every gradient unchanged
    tokens = torch.tensor([[464, 3290, PAD, PAD, 318, 13, PAD, 383], [40, 588, 13, 257, PAD, PAD, PAD, PAD],
                           [11, 12, 13, 14, 15, 16, 17, 18]])
    read = torch.tensor([[1, 3, 7], [0, 6, 2], [7, 5, 0]])  # pads at [0, 3] and [1, 6]: B2 reads tokens 1 and 3
    weights = torch.randn(3, 3, tiny_policy.lm.config.hidden_size, generator=torch.Generator().manual_seed(0))
    params = list(tiny_policy.lm.parameters())
    assert tiny_policy.packed
    outputs, grads = [], []
    for packed in (True, False):
        with packed_as(tiny_policy, packed):
            h = tiny_policy.hidden_at(tokens, read)  # [3, 3, d]
        outputs.append(h)
        grads.append(torch.autograd.grad((h * weights).sum(), params))
    torch.testing.assert_close(outputs[0], outputs[1], atol=1e-5, rtol=1e-5)
    full = tiny_policy.hidden(tokens)  # the padded forward, every position
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


def test_packed_and_hugging_face_samplers_draw_the_same_tokens(tiny_policy):
    contexts = torch.tensor([[464, 3290, PAD, PAD, 318, 13], [40, 588, 13, PAD, PAD, PAD]])
    outs = []
    for packed in (True, False):
        with packed_as(tiny_policy, packed):
            outs.append(tiny_policy.sample(contexts, length=8, generator=torch.Generator().manual_seed(3)))
    assert torch.equal(outs[0]["responses"], outs[1]["responses"])
    torch.testing.assert_close(outs[0]["logprobs"], outs[1]["logprobs"], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[0]["values"], outs[1]["values"], atol=1e-5, rtol=1e-5)


def test_compiled_blocks_give_the_same_numbers_and_gradients(tiny_policy, eager_and_compiled):
    # --compile: torch.compile of gpt2.block_tail (layer norm, GELU, residual adds) changes no number beyond rounding
    contexts = torch.tensor([[464, 3290, PAD, PAD, 318, 13], [40, 588, 13, PAD, PAD, PAD]])
    responses = torch.tensor([[383, 13, 257, 11], [50256, 13, 13, 40]])
    params = list(tiny_policy.lm.parameters())

    def run():
        out = tiny_policy.analyze_responses(contexts, responses)
        grads = torch.autograd.grad(out["logprobs"].sum() + out["values"].sum(), params)
        return out, grads, tiny_policy.sample(contexts, length=5, generator=torch.Generator().manual_seed(2))

    (eager, eager_grads, eager_sampled), (compiled, compiled_grads, compiled_sampled) = eager_and_compiled(run)
    for k in ("logprobs", "values"):
        torch.testing.assert_close(compiled[k], eager[k], atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert torch.equal(compiled_sampled["responses"], eager_sampled["responses"])
    torch.testing.assert_close(compiled_sampled["logprobs"], eager_sampled["logprobs"], atol=1e-5, rtol=1e-5)


def test_decode_attentions_products_equal_the_fused_kernel(monkeypatch):
    # DECODE_ATTENTION "products" (two batched products) against SDPA: one query over the visible columns only
    from lm_human_preference_details.language import gpt2

    torch.manual_seed(0)
    q, keys, values = torch.randn(4, 3, 8, dtype=torch.float64), *torch.randn(2, 4, 3, 10, 8, dtype=torch.float64)
    visible = (torch.arange(10) <= torch.tensor([0, 3, 9, 5])[:, None])[:, None, None]  # [4, 1, 1, 10]
    fused = gpt2.decode_attention(q, keys, values, visible, 0.35)
    monkeypatch.setattr(gpt2, "DECODE_ATTENTION", "products")
    products = gpt2.decode_attention(q, keys, values, visible, 0.35)
    assert products.shape == fused.shape == (4, 3, 1, 8)
    torch.testing.assert_close(products, fused)
    # by hand for row 1: softmax over its first 4 columns only
    w = torch.softmax(keys[1, :, :4] @ q[1, :, :, None] * 0.35, dim=1)  # [3, 4, 1]
    torch.testing.assert_close(products[1, :, 0], (w * values[1, :, :4]).sum(1))
