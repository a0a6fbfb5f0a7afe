"""TensorFlow-1 Adam (FIDELITY D5 TF-1 Adam) and the linear learning-rate decay (D4 reward lr decay, E8 lr decay), used for the
reward model and the policy."""

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
        """One update of every parameter with a gradient: one fused pass over each tensor's p, g, m and v."""
        # OAI lm_human_preferences/utils/core.py: minimize -> tf.train.AdamOptimizer(lr, epsilon=1e-5)
        for group in self.param_groups:
            b1, b2 = group["betas"]
            params = [p for p in group["params"] if p.grad is not None]
            for p in params:
                if not self.state[p]:
                    self.state[p].update(step=0, m=torch.zeros_like(p), v=torch.zeros_like(p))
            for steps, ps in _by_step([(self.state[p]["step"], p) for p in params]).items():
                t = steps + 1
                # torch._fused_adam_ (what torch.optim.Adam(fused=True) runs) steps
                #   p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps'),
                # which with eps' = eps / sqrt(1 - b2^t) is TF-1's lr_t * m / (sqrt(v) + eps), up to float rounding
                step_tensor = torch.tensor(float(t), device=ps[0].device)
                torch._fused_adam_(
                    ps, [p.grad for p in ps], [self.state[p]["m"] for p in ps], [self.state[p]["v"] for p in ps], [],
                    [step_tensor] * len(ps), lr=group["lr"], beta1=b1, beta2=b2, weight_decay=0.0,
                    eps=group["eps"] / math.sqrt(1 - b2**t), amsgrad=False, maximize=False)
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


def annealed_lr(lr: float, done: int, total: int) -> float:
    """Learning rate after ``done`` of ``total`` steps: linear decay from ``lr`` towards 0, never reaching it.

    The reward model counts labels (``done`` = the batch's first label, ``total`` = num_train), the policy updates
    (``done`` = the update's 0-based index, ``total`` = n_updates).
    """
    # D4 reward lr decay: OAI lm_human_preferences/train_reward.py RewardModelTrainer.train,
    # lr = (1 - start_index / num_train) * lr;
    # E8 lr decay: OAI lm_human_preferences/train_policy.py train_minibatch, lrnow = lr * (1 - policy_frac)
    return lr * (1 - done / total)
