"""Issue 31: under --bf16 (autocast) the LM head's logits, log-softmax, sampled log-prob and the chunked backward's
softmax are float32, equal to the float32 computation from the same hidden states.

GPT-2's logits lie near -100, where bfloat16's step is 0.5: the head here is built so that its logits do too (a
tiny head with O(1) logits would hide the rounding). Autocast is CPU bfloat16, as a GPU's would be.
"""

import pytest
import torch

from lm_human_preference_details.lm_head import response_logprobs, sample_step

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
