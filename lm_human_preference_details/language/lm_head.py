"""The LM head's fast kernels: the sampling step and chunked log-probs that never hold all logits at once.

Both compute exactly what the plain formulas give (tests/language/test_lm_head.py checks them against those): a categorical
draw from softmax(h @ W.T / T) with its log-prob (C1 plain sampling, C2 rollout log-probs and values), and log-probs and
entropies of given tokens (C3 scoring slice).

The logits, their softmax and log-softmax are float32 under --bf16 too (`full_precision`): GPT-2's logits lie near
-100, where bfloat16's step is 0.5, so a bf16 logit would move a log-prob by up to ~0.25 nats.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F


@functools.cache  # once per vocabulary size: the search took 0.2-0.4 ms at every sampled token
def _block_size(v: int) -> int:
    """A divisor of v near sqrt(v) (50257 = 29 * 1733 -> 1733), else 256."""
    divisors = [d for d in range(64, 4097) if v % d == 0]
    return min(divisors, key=lambda d: abs(d - math.isqrt(v))) if divisors else 256


def full_precision(device: torch.device) -> torch.autocast:
    """Autocast off inside: the LM head's products run in the dtype of their (cast-up) inputs, float32 at least."""
    # --bf16's deviation (README "Differences") covers the transformer only: the head computes as the original's, fp32
    return torch.autocast(device.type, enabled=False)


def sample_categorical(logits: torch.Tensor, generator: torch.Generator | None = None,
                       u: torch.Tensor | None = None) -> torch.Tensor:
    """[b, v] logits -> [b, 1] tokens drawn from softmax(logits), by inverting the CDF with one uniform per row."""
    # OAI lm_human_preferences/utils/core.py: sample_from_logits (a plain categorical draw). One uniform per
    # row replaces torch.multinomial's per-category randomness: the same distribution, many times faster on CPU.
    return sample_from_weights(torch.softmax(_at_least_fp32(logits), dim=-1), generator, u)


def sample_from_weights(weights: torch.Tensor, generator: torch.Generator | None = None,
                        u: torch.Tensor | None = None) -> torch.Tensor:
    """[b, v] non-negative weights (probabilities up to a factor per row) -> [b, 1] tokens drawn in proportion.

    The row's uniform in [0, 1) is ``u`` ([b, 1] float64, e.g. drawn per emulated rank by `RankDraws.uniforms`) when
    given, else a fresh draw from ``generator`` (the global generator when None).

    Two levels (a block of tokens, then a token inside it) keep every cumulative sum short and in float64,
    so the draw is exact to rounding while reading the [b, v] weights only about twice.
    """
    b, v = weights.shape
    block = _block_size(v)
    n_blocks = -(-v // block)
    if n_blocks * block != v:  # no divisor in range: pad with zero-weight tokens
        weights = F.pad(weights, (0, n_blocks * block - v))
    blocks = weights.view(b, n_blocks, block)  # [b, n_blocks, block]
    block_cdf = blocks.sum(-1).double().cumsum(-1)  # [b, n_blocks]
    if u is None:
        u = torch.rand(b, 1, dtype=torch.float64, device=weights.device, generator=generator)
    u = u * block_cdf[:, -1:]
    k = torch.searchsorted(block_cdf, u, right=True).clamp_(max=n_blocks - 1)  # [b, 1] chosen block
    before = torch.where(k > 0, block_cdf.gather(1, (k - 1).clamp(min=0)), torch.zeros_like(u))  # mass of earlier blocks
    inner_cdf = blocks.gather(1, k[:, :, None].expand(b, 1, block)).squeeze(1).double().cumsum(-1)  # [b, block]
    j = torch.searchsorted(inner_cdf, u - before, right=True).clamp_(max=block - 1)  # [b, 1] token in the block
    return (k * block + j).clamp_(max=v - 1)


def sample_step(h: torch.Tensor, weight: torch.Tensor, temperature: float, generator: torch.Generator | None = None,
                u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, d] hidden states, [V, d] LM head -> ([b, 1] tokens drawn from softmax(h @ W.T / T), [b, 1] their log-probs).

    The same draw and log-prob as `sample_categorical` and `logprobs_from_logits` on the scaled logits, in four
    passes over the [b, V] logits instead of about ten: exp(logits - max) is both the sampling weight and the
    log-sum-exp's summand.
    """
    # OAI lm_human_preferences/policy.py: respond_op (logits / temperature, sample, logprob of the sample)
    with full_precision(h.device):
        h = _at_least_fp32(h) / temperature  # (h / T) @ W.T: the division touches [b, d], not [b, V]
        logits = head_logits(h, weight)  # [b, V]
        m = logits.amax(dim=-1, keepdim=True)  # [b, 1]
        weights = logits.sub_(m).exp_()  # [b, V] exp(logits - max), in place
        token = sample_from_weights(weights, generator, u)  # [b, 1]
        # log-prob = logit - max - log(sum exp(logit - max)); the logit recomputed from h exactly
        logit = torch.einsum("bd,bd->b", h, _at_least_fp32(weight[token.squeeze(1)]))[:, None]
        return token, logit - m - weights.sum(dim=-1, keepdim=True).log()


def head_logits(h: torch.Tensor, weight: torch.Tensor, real: int | None = None) -> torch.Tensor:
    """[n, d] hidden, [V, d] LM head -> [n, V] logits h @ W.T in float32 at least (autocast off).

    ``real``: the head's rows from ``real`` on only pad the vocabulary to an aligned size (`aligned_rows`); their
    columns are set to the dtype's lowest number, so that they weigh exactly nothing in a softmax and its entropy.
    """
    with full_precision(h.device):
        h, weight = _at_least_fp32(h), _at_least_fp32(weight)
        if real is None:  # the same products; with the vocabulary as the rows MKL runs faster on a CPU (docs/speed.md)
            return (weight @ h.t()).t().contiguous()
        # an aligned vocabulary: [n, V] directly, every matrix's rows a multiple of 16 bytes apart for cuBLAS
        logits = h @ weight.t()
        logits[:, real:] = torch.finfo(logits.dtype).min
        return logits


GPU_VOCAB_MULTIPLE = 64  # on a GPU the log-probs' products run on the vocabulary padded to a multiple of 64


def vocab_multiple(device: torch.device) -> int:
    """What the chunked log-probs pad the vocabulary to a multiple of: 1 (none) on a CPU, GPU_VOCAB_MULTIPLE on a GPU.

    GPT-2's 50257 tokens make every [rows, vocab] matrix's rows 201,028 bytes apart, which is no multiple of 16: cuBLAS
    then runs its slower unaligned kernels for the three products of the head (docs/speed.md).
    """
    return 1 if device.type == "cpu" else GPU_VOCAB_MULTIPLE


def aligned_rows(weight: torch.Tensor, multiple: int) -> torch.Tensor:
    """[V, d] LM head -> [Vp, d] with zero rows up to a multiple of ``multiple`` (the tensor itself when V is one)."""
    pad = -weight.shape[0] % multiple
    return F.pad(weight, (0, 0, 0, pad)) if pad else weight


def _at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """float16 / bfloat16 -> float32; float32 and float64 unchanged."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


KEEP_PROBS_ELEMENTS = 2**27  # keep the forward's probabilities for backward up to 512 MiB of float32
GPU_KEEP_PROBS_ELEMENTS = 2**30  # on a GPU, up to 4 GiB: batch 512's 12,288 response positions (2.5 GiB) are kept
GPU_CHUNK_ELEMENTS = 2**27  # on a GPU, logits of up to 512 MiB of float32 per chunk


def logprob_chunk_rows(vocab: int, device: torch.device) -> int:
    """Rows of logits per chunk: 64 on a CPU (they stay in cache), else as many as fit in GPU_CHUNK_ELEMENTS, a
    multiple of 64 (aligned products)."""
    # a GPU needs big products to be busy: 64-row chunks' small kernels take longer to launch than to run (docs/speed.md)
    return 64 if device.type == "cpu" else max(64, GPU_CHUNK_ELEMENTS // vocab // 64 * 64)


def kept_probs_budget(device: torch.device) -> int:
    """The most softmax numbers the forward pass keeps for the backward pass (else it recomputes them)."""
    return KEEP_PROBS_ELEMENTS if device.type == "cpu" else GPU_KEEP_PROBS_ELEMENTS


class _ChunkedLogprobs(torch.autograd.Function):
    """Log-probs (and detached entropies) of labels under softmax(h @ W.T / T), a chunk of rows at a time.

    Never holds the [n, vocab] logits of all rows at once. The backward pass needs softmax(logits): it is kept
    from the forward pass when all of it fits in keep_probs_elements numbers, else recomputed chunk by chunk.
    With ``multiple`` > 1 the products run on the head padded with zero rows to a multiple of it (`aligned_rows`):
    the padding's logits are the lowest number, its probabilities 0 and its gradients dropped, so the same numbers.
    """

    @staticmethod
    def forward(ctx, h, weight, labels, temperature: float, chunk: int, keep_probs_elements: int, multiple: int = 1):
        with full_precision(h.device):
            return _ChunkedLogprobs._forward(ctx, h, weight, labels, temperature, chunk, keep_probs_elements, multiple)

    @staticmethod
    def _forward(ctx, h, weight, labels, temperature: float, chunk: int, keep_probs_elements: int, multiple: int):
        """`forward`'s work, autocast off: ``h`` cast up to float32 at least, every product in its dtype."""
        ctx.h_dtype = h.dtype
        h = _at_least_fp32(h) / temperature  # (h / T) @ W.T: the division touches [n, d], not [n, V]
        v = weight.shape[0]
        real = v if multiple > 1 else None  # the padded head's columns past v are set to the lowest number
        padded = aligned_rows(weight, multiple)  # [Vp, d]
        n, vp = h.shape[0], padded.shape[0]
        # (grad mode is always off inside forward: needs_input_grad says whether a backward pass can follow)
        keep = any(ctx.needs_input_grad[:2]) and n * vp <= keep_probs_elements
        probs = h.new_empty((n, vp), dtype=torch.promote_types(h.dtype, torch.float32)) if keep else None  # [n, Vp]
        logprobs, entropies, lses = [], [], []
        for i in range(0, n, chunk):
            logits = head_logits(h[i : i + chunk], padded, real)  # [chunk, Vp]
            m = logits.amax(dim=-1, keepdim=True)
            z = logits.sub_(m)  # shifted logits, in place
            e = torch.exp(z, out=probs[i : i + chunk]) if keep else torch.exp(z)  # kept: written in place
            s = e.sum(dim=-1, keepdim=True)
            log_s = s.log()  # logsumexp = m + log_s
            logprobs.append((z.gather(1, labels[i : i + chunk, None]) - log_s).squeeze(1))
            # entropy = logsumexp - sum(p * logits) = log_s - sum(e * z) / s (OAI utils/core.py: entropy_from_logits)
            entropies.append((log_s - torch.bmm(e.unsqueeze(1), z.unsqueeze(2)).squeeze(2) / s).squeeze(1))
            lses.append((m + log_s).squeeze(1))
            if keep:
                e.div_(s)  # softmax, in place in probs
        ctx.save_for_backward(h, padded, labels, torch.cat(lses), probs)
        ctx.temperature, ctx.chunk, ctx.real, ctx.weight_dtype = temperature, chunk, real, weight.dtype
        entropies = torch.cat(entropies)
        ctx.mark_non_differentiable(entropies)  # only logged: no entropy bonus (FIDELITY E7 policy loss)
        return torch.cat(logprobs), entropies

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropies):
        with full_precision(grad_logprobs.device):
            return _ChunkedLogprobs._backward(ctx, grad_logprobs)

    @staticmethod
    def _backward(ctx, grad_logprobs):
        """`backward`'s work, autocast off."""
        h, padded, labels, lse, probs = ctx.saved_tensors  # h is already divided by T, and float32 at least; [Vp, d]
        real = ctx.real
        grad_h = torch.empty_like(h)
        # in place, so that under autocast too the [V, d] gradient is summed in (at least) float32
        grad_w = _at_least_fp32(torch.zeros_like(padded))  # [Vp, d]
        for i in range(0, h.shape[0], ctx.chunk):
            rows = slice(i, i + ctx.chunk)
            if probs is not None:
                softmax = probs[rows]  # [chunk, Vp], kept from the forward pass
            else:
                softmax = torch.exp_(head_logits(h[rows], padded, real).sub_(lse[rows, None]))  # recomputed
            # d logprob / d logits = onehot(label) - softmax(logits)
            dlogits = softmax * -grad_logprobs[rows, None]
            dlogits.scatter_add_(1, labels[rows, None], grad_logprobs[rows, None])
            grad_h[rows] = (dlogits @ padded.to(dlogits.dtype)).to(h.dtype)
            grad_w.addmm_(dlogits.t(), h[rows].to(dlogits.dtype))  # [Vp, d]
        # chain through h / T
        grad_weight = grad_w if real is None else grad_w[:real]  # the padding's rows dropped
        return (grad_h / ctx.temperature).to(ctx.h_dtype), grad_weight.to(ctx.weight_dtype), None, None, None, None, None


def response_logprobs(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
                      chunk: int | None = None, keep_probs_elements: int | None = None,
                      multiple: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, r, d] hidden, [V, d] LM head, [b, r] labels -> log-probs (differentiable) and entropies, both [b, r].

    Same numbers as log_softmax(h @ W.T / T) gathered at the labels, in memory for ``chunk`` rows of logits (default
    `logprob_chunk_rows`), plus the softmax of all rows for the backward pass while it holds at most
    ``keep_probs_elements`` numbers (default `kept_probs_budget`); the products on the vocabulary padded to a
    ``multiple`` (default `vocab_multiple`).
    """
    b, r, d = h.shape
    multiple = multiple or vocab_multiple(h.device)
    chunk = chunk or logprob_chunk_rows(weight.shape[0] + -weight.shape[0] % multiple, h.device)
    keep = kept_probs_budget(h.device) if keep_probs_elements is None else keep_probs_elements
    logprobs, entropies = _ChunkedLogprobs.apply(h.reshape(b * r, d), weight, labels.reshape(b * r), temperature, chunk,
                                                 keep, multiple)
    return logprobs.view(b, r), entropies.view(b, r)
