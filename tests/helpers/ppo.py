"""A PPO update's inputs on a tiny policy: a rollout's data and the options train_policy.ppo_epochs takes."""

from __future__ import annotations

import torch

import train_policy

PAD = 50257


def rollout_data(policy, n: int = 16, response_length: int = 5) -> dict[str, torch.Tensor]:
    """``n`` contexts of 6 tokens (pads in the middle of every third), ``policy``'s sampled responses and random
    rewards, seeded: what a rollout hands the PPO epochs."""
    torch.manual_seed(3)
    contexts = torch.randint(0, 50257, (n, 6))
    contexts[::3, 2:4] = PAD  # pads in the middle of some contexts
    sampled = policy.sample(contexts, response_length)
    rewards = torch.randn(n, response_length)
    return {"contexts": contexts, **sampled, "rewards": rewards}


def ppo_args(micro: int) -> train_policy.Args:
    """The sentiment preset cut to one epoch of 16 episodes on 2 ranks, lr 1e-3, micro-batches of ``micro`` sequences
    (0: none)."""
    args = train_policy.build_args("sentiment")
    args.ppo.batch_size, args.ppo.noptepochs, args.num_ranks, args.ppo.lr = 16, 1, 2, 1e-3
    args.micro_batch_sequences = micro
    return args.finalize(check_inputs=False)
