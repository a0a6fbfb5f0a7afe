"""The LM head's kernels (FIDELITY C1-C3): chunked log-probs and the sampling step against the plain formulas."""

import math

import pytest
import torch
import torch.nn.functional as F

from lm_human_preference_details.language.lm_head import (
    GPU_CHUNK_ELEMENTS,
    aligned_rows,
    kept_probs_budget,
    logprob_chunk_rows,
    response_logprobs,
    sample_categorical,
    sample_step,
    vocab_multiple,
)
from lm_human_preference_details.ppo import logprobs_from_logits


@pytest.mark.parametrize("multiple", [1, 16])  # the head as it is (a CPU) / padded to 64 rows (a GPU's aligned products)
@pytest.mark.parametrize("keep_probs_elements", [0, 15 * 64])  # backward recomputes the softmax / keeps all of it
def test_chunked_logprobs_match_the_plain_computation_and_gradients(keep_probs_elements, multiple):

    torch.manual_seed(0)
    h = torch.randn(3, 5, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 50, (3, 5))
    logprobs, entropies = response_logprobs(h, w, labels, temperature=0.7, chunk=4,  # chunks cut across rows
                                            keep_probs_elements=keep_probs_elements, multiple=multiple)
    kept = logprobs.grad_fn.next_functions[0][0].saved_tensors[-1]  # the [15, 50] (padded: [15, 64]) softmax, or None
    assert (kept is None) == (keep_probs_elements == 0)
    if kept is not None:
        assert kept.shape == (15, 50 if multiple == 1 else 64) and (kept[:, 50:] == 0).all()
    logp = F.log_softmax(h @ w.t() / 0.7, -1)
    expected = logp.gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(logprobs, expected)
    torch.testing.assert_close(entropies, -(logp.exp() * logp).sum(-1))
    assert not entropies.requires_grad
    g = torch.randn(3, 5, dtype=torch.float64)
    grads = torch.autograd.grad((logprobs * g).sum(), (h, w))
    expected_grads = torch.autograd.grad((expected * g).sum(), (h, w))
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b)


def test_sample_categorical_draws_from_the_softmax():

    # a 600-token distribution (blocks of 75 tokens); a few heavy tokens, incl. the first and last
    logits = torch.full((600,), -2.0)
    logits[[0, 255, 256, 300, 599]] = torch.tensor([1.0, 2.0, 0.5, 1.5, 2.5])
    probs = torch.softmax(logits.double(), -1)
    g = torch.Generator().manual_seed(0)
    n = 200_000  # in 20 batches of 10,000 rows: one of 200,000 was 0.5 GB of fresh pages, 2.8 of its 3.1 CPU s in the kernel
    draws = torch.cat([sample_categorical(logits.expand(n // 20, 600), generator=g).squeeze(1) for _ in range(20)])
    counts = torch.bincount(draws, minlength=600).double()
    assert draws.min() >= 0 and draws.max() < 600
    for t in [0, 255, 256, 300, 599, 17]:  # each frequency within 5 standard errors of its probability
        se = math.sqrt(probs[t] * (1 - probs[t]) / n)
        assert abs(counts[t] / n - probs[t]) < 5 * se, t
    # a chi-square over all 600 tokens stays near its 599 degrees of freedom
    chi2 = ((counts - n * probs) ** 2 / (n * probs)).sum().item()
    assert chi2 < 599 + 6 * math.sqrt(2 * 599)


def test_sample_categorical_pads_a_vocabulary_without_a_divisor():

    v = 4099  # prime: the blocks are padded with zero-probability tokens, which are never drawn
    logits = torch.full((v,), -3.0)
    logits[[0, 4098]] = torch.tensor([4.0, 4.5])
    probs = torch.softmax(logits.double(), -1)
    g = torch.Generator().manual_seed(1)
    draws = torch.cat([sample_categorical(logits.expand(2000, v), generator=g).squeeze(1) for _ in range(10)])
    assert draws.max() < v
    for t in (0, 4098):
        se = math.sqrt(probs[t] * (1 - probs[t]) / len(draws))
        assert abs((draws == t).double().mean() - probs[t]) < 5 * se


def test_sample_step_draws_from_the_scaled_softmax_and_returns_its_logprob():

    torch.manual_seed(0)
    w = torch.randn(600, 8)
    h = torch.randn(1, 8) * 2
    probs = torch.softmax((h @ w.t()).double() / 0.7, -1)[0]  # [600]
    g = torch.Generator().manual_seed(0)
    n = 100_000
    tokens, logprobs = sample_step(h.expand(n, 8), w, 0.7, generator=g)  # [n, 1] each
    # the log-prob of each draw is log_softmax(h @ W.T / T) at that token
    expected = logprobs_from_logits((h @ w.t() / 0.7).expand(n, 600)[:, None], tokens)
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=1e-5)
    counts = torch.bincount(tokens.squeeze(1), minlength=600).double()
    heavy = probs.argsort(descending=True)[:5]
    for t in heavy.tolist():  # the likeliest tokens' frequencies within 5 standard errors
        se = math.sqrt(probs[t] * (1 - probs[t]) / n)
        assert abs(counts[t] / n - probs[t]) < 5 * se, t
    keep = probs * n >= 5  # chi-square over the tokens expected at least 5 times
    chi2 = ((counts[keep] - n * probs[keep]) ** 2 / (n * probs[keep])).sum().item()
    dof = int(keep.sum()) - 1
    assert chi2 < dof + 6 * math.sqrt(2 * dof)


def test_logprob_chunk_rows():

    assert logprob_chunk_rows(50257, torch.device("cpu")) == 64
    # a GPU: 512 MiB of float32 logits per chunk (never fewer than 64 rows): 2**27 // 50304 (GPT-2's vocabulary padded
    # to a multiple of 64) = 2668 rows, down to a multiple of 64 (aligned products)
    assert GPU_CHUNK_ELEMENTS == 2**27 and logprob_chunk_rows(50304, torch.device("cuda")) == 2624
    assert logprob_chunk_rows(2**22, torch.device("cuda")) == 64


def test_the_gpu_pads_the_vocabulary_and_keeps_batch_512s_softmax():

    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert vocab_multiple(cpu) == 1 and vocab_multiple(gpu) == 64
    w = torch.randn(50, 3)
    assert aligned_rows(w, 1) is w and aligned_rows(w, 25) is w
    padded = aligned_rows(w, 64)
    assert padded.shape == (64, 3) and torch.equal(padded[:50], w) and (padded[50:] == 0).all()
    # batch 512 x 24 response positions x 50304 padded tokens: kept on a GPU (2.4 GiB), recomputed on a CPU
    assert 512 * 24 * 50304 <= kept_probs_budget(gpu) and 512 * 24 * 50304 > kept_probs_budget(cpu) == 2**27
