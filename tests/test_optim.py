"""FIDELITY D5: TensorFlow-1 Adam, eps added to sqrt(v) before the bias correction."""

import math

import numpy as np
import torch

from lm_human_preference_details.optim import TF1Adam, set_lr


def naive_tf_adam(param, grads, lr, b1=0.9, b2=0.999, eps=1e-5):
    """A line-by-line transcription of tf.train.AdamOptimizer's documented update."""
    m = np.zeros_like(param)
    v = np.zeros_like(param)
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        lr_t = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        param = param - lr_t * m / (np.sqrt(v) + eps)
    return param


def test_first_step_by_hand():
    # t=1, g=1e-4: m = 1e-5, v = 1e-11, lr_t = 0.1 * sqrt(0.001) / 0.1 = sqrt(0.001) = 0.0316228
    # step = lr_t * m / (sqrt(v) + eps) = 0.0316228 * 1e-5 / (3.16228e-6 + 1e-5) = 0.0240253
    p = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    opt = TF1Adam([p], lr=0.1, eps=1e-5)
    p.grad = torch.tensor([1e-4], dtype=torch.float64)
    opt.step()
    assert abs(p.item() - (1 - 0.0240253)) < 1e-6
    # PyTorch's Adam would step lr * m_hat / (sqrt(v_hat) + eps) = 0.1 * 1e-4 / (1e-4 + 1e-5) = 0.0909
    q = torch.nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    torch_opt = torch.optim.Adam([q], lr=0.1, eps=1e-5)
    q.grad = torch.tensor([1e-4], dtype=torch.float64)
    torch_opt.step()
    assert abs(q.item() - (1 - 0.0909091)) < 1e-6


def test_matches_naive_transcription_over_steps():
    rng = np.random.default_rng(0)
    start = rng.normal(size=5)
    grads = [rng.normal(size=5) * 10 ** rng.uniform(-6, 0) for _ in range(6)]
    p = torch.nn.Parameter(torch.tensor(start))
    opt = TF1Adam([p], lr=1e-3)
    for g in grads:
        p.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(p.detach().numpy(), naive_tf_adam(start, grads, 1e-3), rtol=0, atol=1e-12)


def test_set_lr_changes_the_step():
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = TF1Adam([p], lr=1.0)
    set_lr(opt, 0.0)
    p.grad = torch.ones(1, dtype=torch.float64)
    opt.step()
    assert p.item() == 0.0


def test_several_parameters_and_one_that_skips_a_step():
    # each parameter follows the transcription with its own step count; b has no gradient at step 2
    rng = np.random.default_rng(1)
    a0, b0 = rng.normal(size=3), rng.normal(size=(2, 2))
    ga = [rng.normal(size=3) for _ in range(3)]
    gb = [rng.normal(size=(2, 2)) for _ in range(2)]
    a, b = torch.nn.Parameter(torch.tensor(a0)), torch.nn.Parameter(torch.tensor(b0))
    opt = TF1Adam([a, b], lr=1e-2)
    for step in range(3):
        a.grad = torch.tensor(ga[step])
        b.grad = None if step == 1 else torch.tensor(gb[0 if step == 0 else 1])
        opt.step()
    np.testing.assert_allclose(a.detach().numpy(), naive_tf_adam(a0, ga, 1e-2), rtol=0, atol=1e-12)
    np.testing.assert_allclose(b.detach().numpy(), naive_tf_adam(b0, gb, 1e-2), rtol=0, atol=1e-12)
    assert opt.state[a]["step"] == 3 and opt.state[b]["step"] == 2


def test_float32_parameters_follow_the_transcription():
    # the dtype training uses: the fused update stays within float32 rounding of the float64 transcription
    rng = np.random.default_rng(2)
    start = rng.normal(size=(64, 3))
    grads = [rng.normal(size=(64, 3)) * 10 ** rng.uniform(-7, -1) for _ in range(5)]
    p = torch.nn.Parameter(torch.tensor(start, dtype=torch.float32))
    opt = TF1Adam([p], lr=1e-3)
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
    expected = naive_tf_adam(start, grads, 1e-3)
    np.testing.assert_allclose(p.detach().double().numpy(), expected, rtol=0, atol=2e-6)
    assert np.abs(expected - start).max() > 1e-3  # the steps are far larger than the tolerance
