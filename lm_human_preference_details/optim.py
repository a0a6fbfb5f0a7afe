"""TensorFlow-1 Adam (FIDELITY D5), used for both the reward model and the policy."""

from __future__ import annotations

import math

import torch


class TF1Adam(torch.optim.Optimizer):
    """Adam as tf.train.AdamOptimizer computes it: eps is added to sqrt(v) *before* bias correction.

    lr_t = lr * sqrt(1 - b2^t) / (1 - b1^t);  param -= lr_t * m / (sqrt(v) + eps).
    PyTorch's Adam divides by sqrt(v_hat) + eps instead, which takes bigger steps while v is small.
    """

    def __init__(self, params, lr: float, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-5):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter with a gradient, all tensors of a group at once (torch._foreach_*)."""
        # OAI lm_human_preferences/utils/core.py: minimize -> tf.train.AdamOptimizer(lr, epsilon=1e-5)
        for group in self.param_groups:
            b1, b2 = group["betas"]
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if not self.state[p]:
                    # "denominator" is scratch for sqrt(v) + eps: a buffer kept between steps instead of a fresh
                    # parameter-sized tensor each step (on a CPU, fresh large tensors cost a page fault per 4 KiB)
                    self.state[p].update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p), denominator=torch.empty_like(p))
            for steps, ps in _by_step([(self.state[p]["step"], p) for p in params]).items():
                grads = [p.grad for p in ps]
                m = [self.state[p]["m"] for p in ps]
                v = [self.state[p]["v"] for p in ps]
                denominators = [self.state[p]["denominator"] for p in ps]
                t = steps + 1
                torch._foreach_mul_(m, b1)
                torch._foreach_add_(m, grads, alpha=1 - b1)  # m = b1 m + (1 - b1) g
                torch._foreach_mul_(v, b2)
                torch._foreach_addcmul_(v, grads, grads, value=1 - b2)  # v = b2 v + (1 - b2) g^2
                torch._foreach_copy_(denominators, v)
                torch._foreach_sqrt_(denominators)
                torch._foreach_add_(denominators, group["eps"])  # sqrt(v) + eps, before bias correction
                lr_t = group["lr"] * math.sqrt(1 - b2**t) / (1 - b1**t)
                torch._foreach_addcdiv_(ps, m, denominators, value=-lr_t)
                for p in ps:
                    self.state[p]["step"] = t


def _by_step(pairs: list[tuple[int, torch.Tensor]]) -> dict[int, list[torch.Tensor]]:
    """Parameters grouped by their step count (all equal unless some went without gradients)."""
    groups: dict[int, list[torch.Tensor]] = {}
    for step, p in pairs:
        groups.setdefault(step, []).append(p)
    return groups


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr
