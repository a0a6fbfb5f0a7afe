"""language/model.py under --bf16 (autocast) the LM head's logits, log-softmax, sampled log-prob and the chunked backward's
softmax are float32, equal to the float32 computation from the same hidden states; so are the value and
reward heads.

GPT-2's logits lie near -100, where bfloat16's step is 0.5: the head here is built so that its logits do too (a
tiny head with O(1) logits would hide the rounding). Autocast is CPU bfloat16, as a GPU's would be.
"""

import pytest
import torch

from lm_human_preference_details.language.lm_head import response_logprobs, sample_step

V, D, T = 512, 64, 0.7


def head_near_minus_100(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """([6, D] hidden states, [V, D] LM head), both exactly representable in bfloat16, whose logits h @ W.T / T lie
    around -100 / T with a spread of a few nats."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(6, D, generator=g)
    w = torch.randn(V, D, generator=g) * 0.3
    h[:, 0], w[:, 0] = 10.0, -10.0 + 0.1 * torch.randn(V, generator=g)  # the shared direction: logits near -100
    return h.bfloat16().float(), w.bfloat16().float()


def fp32_reference(h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """[n, V] float32 log-softmax of h @ W.T / T, no autocast."""
    return torch.log_softmax((h / T) @ w.t(), dim=-1)


def test_the_logits_lie_near_minus_100():
    h, w = head_near_minus_100()
    logits = (h / T) @ w.t()
    assert -160 < logits.mean() < -120 and logits.std() > 1
    assert (logits.bfloat16().float() - logits).abs().max() > 0.1  # what bf16 logits would lose


def test_sampling_step_is_float32_under_bf16_autocast():
    h, w = head_near_minus_100()
    u = torch.rand(len(h), 1, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    expected_token, expected = sample_step(h, w, T, u=u)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        token, logprob = sample_step(h, w, T, u=u)
    assert logprob.dtype == torch.float32 and torch.equal(token, expected_token)
    torch.testing.assert_close(logprob, expected, atol=1e-5, rtol=0)
    # the plain formula sums in another order: float32 logits of ~140 agree to ~1e-5 of it
    torch.testing.assert_close(logprob[:, 0], fp32_reference(h, w).gather(1, token)[:, 0], atol=1e-4, rtol=0)


@pytest.mark.parametrize("keep_probs_elements", [2**27, 0], ids=["kept-softmax", "recomputed-softmax"])
def test_chunked_logprobs_and_their_backward_are_float32_under_bf16_autocast(keep_probs_elements):
    h, w = head_near_minus_100()
    labels = torch.randint(0, V, (2, 3), generator=torch.Generator().manual_seed(2))
    grad = torch.randn(2, 3, generator=torch.Generator().manual_seed(3))

    def run(autocast: bool):
        hh, ww = h.view(2, 3, D).clone().requires_grad_(), w.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logprobs, entropies = response_logprobs(hh, ww, labels, T, chunk=4, keep_probs_elements=keep_probs_elements)
        (logprobs * grad).sum().backward()
        return logprobs, entropies, hh.grad, ww.grad

    plain = run(autocast=False)
    for name, got, want in zip(("logprobs", "entropies", "grad h", "grad W"), run(autocast=True), plain):
        assert got.dtype == torch.float32, name
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=name)
    reference = fp32_reference(h, w).gather(1, labels.view(-1, 1)).view(2, 3)
    torch.testing.assert_close(plain[0], reference, atol=1e-4, rtol=0)  # summation order, as above


def test_value_and_reward_heads_are_float32_under_bf16_autocast():
    """The scalar heads (values, rewards) compute in float32 under --bf16, as the LM head does: every call of
    the head, from the policy's forward, analyze_responses and sample and the reward model's forward, gives float32
    outputs equal to the float32 product of its inputs, where a bfloat16 one is off by ~1e-3 at |v| ~ 1."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from lm_human_preference_details.language.model import Policy, RewardModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=1, n_head=2, bos_token_id=0, eos_token_id=0)
    pad = 63
    policy, reward = Policy(GPT2LMHeadModel(config), pad, 0.7), RewardModel(GPT2LMHeadModel(config), pad)
    calls = []

    def check(head, inputs, output):
        calls.append((inputs[0].detach(), output.detach(), head))

    for model in (policy, reward):
        torch.nn.init.normal_(model.head.weight, std=0.5)
        torch.nn.init.constant_(model.head.bias, 1.0)  # outputs around 1, where bfloat16's step is 2^-7
        model.head.register_forward_hook(check)
    queries = torch.tensor([[5, pad, 7, 9], [3, 4, 8, 2]])
    responses = torch.tensor([[11, 12, 13], [14, 62, 15]])
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        returned = [policy(queries)[1], policy.analyze_responses(queries, responses)["values"],
                    policy.sample(queries, 3, generator=torch.Generator().manual_seed(0))["values"],
                    reward.score(queries, responses)]
    assert len(calls) == 1 + 1 + 3 + 1  # forward, analyze_responses, three sampling steps, the reward model
    worst_bf16 = 0.0
    for h, out, head in calls:
        assert out.dtype == torch.float32
        exact = torch.nn.functional.linear(h.float(), head.weight, head.bias)
        torch.testing.assert_close(out, exact, atol=1e-6, rtol=0)
        as_bf16 = torch.nn.functional.linear(h.bfloat16(), head.weight.bfloat16(), head.bias.bfloat16()).float()
        worst_bf16 = max(worst_bf16, (as_bf16 - exact).abs().max().item())
    assert worst_bf16 > 1e-3  # what the heads would lose in bfloat16: the check above can fail
    assert all(v.dtype == torch.float32 for v in returned)
    torch.testing.assert_close(returned[0], calls[0][1].squeeze(-1))
    torch.testing.assert_close(returned[3], reward.gain * calls[-1][1].squeeze(-1) + reward.bias)
