"""The tensor maths of PPO in lm-human-preferences (FIDELITY C3 scoring slice, E2-E7), as small pure functions.

Every function here is free of I/O and of model calls; train_policy.py composes them.
Shapes: b = episodes (rows), r = response_length, v = vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

WHITEN_MIN_EPISODES = 8  # OAI lm_human_preferences/train_policy.py: train, assert per_rank_minibatch_size >= 8


# ---------------------------------------------------------------------------------------------
# C3 scoring slice: log-probs and entropies of logits
# ---------------------------------------------------------------------------------------------


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """[b, r, v] logits, [b, r] labels -> [b, r] float32 log-probabilities of the labels."""
    # OAI lm_human_preferences/utils/core.py: logprobs_from_logits (= -sparse softmax cross-entropy)
    # logit of the label minus logsumexp: no [b, r, v] log-softmax tensor is kept for the backward pass
    logits = logits.float()
    return torch.gather(logits, -1, labels.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)  # [b, r]


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """[b, r, v] logits -> [b, r] float32 entropies of the categorical distributions."""
    # OAI lm_human_preferences/utils/core.py: entropy_from_logits, logsumexp(l) - sum(softmax(l) * l)
    logits = logits.float()
    probs = F.softmax(logits, dim=-1)  # [b, r, v]
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)  # [b, r]


# ---------------------------------------------------------------------------------------------
# E2 truncate and score: truncation and rejection of responses before scoring
# ---------------------------------------------------------------------------------------------


def truncate_responses(
    responses: torch.Tensor, truncate_token: int | None, truncate_after: int, pad_id: int
) -> torch.Tensor:
    """[b, r] responses -> [b, r] postprocessed_responses: pad after the first truncate_token at >= truncate_after."""
    # OAI lm_human_preferences/lm_tasks.py: postprocess_fn_from_hparams (get_mask, truncate)
    if truncate_token is None:
        return responses
    hits = (responses == truncate_token).long()  # [b, r]
    hits[:, :truncate_after] = 0  # [b, :truncate_after] an earlier truncate token does not count
    # exclusive running count: > 0 strictly after the first hit, so the truncate token itself stays
    after_first_hit = (hits.cumsum(dim=1) - hits) > 0  # [b, r]
    return torch.where(after_first_hit, torch.full_like(responses, pad_id), responses)


def responses_pass_filter(responses: torch.Tensor, truncate_token: int | None, truncate_after: int) -> torch.Tensor:
    """[b, r] responses -> [b] bool: True where a truncate_token sits at index >= truncate_after."""
    # OAI lm_human_preferences/lm_tasks.py: filter_fn_from_hparams
    if truncate_token is None:
        return torch.ones(responses.shape[0], dtype=torch.bool, device=responses.device)
    return (responses[:, truncate_after:] == truncate_token).any(dim=-1)  # [b, r - truncate_after] -> [b]


def apply_rejection(scores: torch.Tensor, passed: torch.Tensor, penalty_reward_value: float) -> torch.Tensor:
    """[b] scores, [b] bool passed -> [b] scores with penalty_reward_value where the filter failed."""
    # OAI lm_human_preferences/train_policy.py: make_score_fn.penalize
    return torch.where(passed, scores, torch.full_like(scores, penalty_reward_value))


# ---------------------------------------------------------------------------------------------
# E3 KL penalty: per-token KL penalty, score at the last token
# ---------------------------------------------------------------------------------------------


def kl_rewards(
    scores: torch.Tensor, logprobs: torch.Tensor, ref_logprobs: torch.Tensor, kl_coef: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[b] scores, [b, r] logprobs and ref_logprobs -> ([b, r] rewards, [b, r] non_score_reward, [b, r] kl)."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.__init__.compute_rewards
    kl = logprobs - ref_logprobs  # [b, r]
    non_score_reward = -kl_coef * kl  # [b, r]
    rewards = non_score_reward.clone()  # [b, r]
    # the score lands on index r - 1 even when the scored response was truncated earlier
    rewards[:, -1] += scores  # [b]
    return rewards, non_score_reward, kl


# ---------------------------------------------------------------------------------------------
# E4 KL controller: KL coefficient controllers
# ---------------------------------------------------------------------------------------------


class FixedKLController:
    """A constant kl_coef; `update` does nothing."""

    # OAI lm_human_preferences/train_policy.py: FixedKLController
    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Keep the coefficient as it is."""


class AdaptiveKLController:
    """Proportional control of kl_coef towards a target KL (Ziegler et al. 2019, section 2.2)."""

    # OAI lm_human_preferences/train_policy.py: AdaptiveKLController
    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        self.value = float(init_kl_coef)
        self.target = float(target)
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        """value *= 1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon."""
        proportional_error = min(max(float(current_kl) / self.target - 1, -0.2), 0.2)
        self.value *= 1 + proportional_error * n_steps / self.horizon


# ---------------------------------------------------------------------------------------------
# E5 whitening and GAE: whitening and generalised advantage estimation
# ---------------------------------------------------------------------------------------------


def whiten_in_groups(
    x: torch.Tensor,
    group_size: int | None,
    shift_mean: bool = True,
    *,
    min_group_size: int = WHITEN_MIN_EPISODES,
) -> torch.Tensor:
    """[b, r] x -> [b, r], each run of group_size consecutive rows whitened on its own (None: one group)."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.loss runs on each of 8 MPI ranks, so each
    # rank whitens only its own minibatch; a group here stands for one rank's minibatch. Each group as
    # OAI lm_human_preferences/utils/core.py: whiten (tf.nn.moments over every axis, population variance)
    n_rows = x.shape[0]
    group_size = n_rows if group_size is None else group_size
    if group_size < 1 or n_rows % group_size != 0:
        raise ValueError(f"cannot whiten {n_rows} episodes in groups of {group_size}: they must divide exactly")
    if group_size < min_group_size:
        raise ValueError(f"whitening groups of {group_size} episodes are under the minimum of {min_group_size}")
    groups = x.reshape(n_rows // group_size, -1)  # [n_groups, group_size * r]
    mean = groups.mean(dim=1, keepdim=True)  # [n_groups, 1]
    var = ((groups - mean) ** 2).mean(dim=1, keepdim=True)  # [n_groups, 1]
    whitened = (groups - mean) * torch.rsqrt(var + 1e-8)  # [n_groups, group_size * r]
    if not shift_mean:
        whitened = whitened + mean
    return whitened.reshape(x.shape)  # [b, r]


def compute_advantages(
    rewards: torch.Tensor,
    values: torch.Tensor,
    gamma: float,
    lam: float,
    whiten_group_size: int | None,
    whiten_rewards: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, r] rewards and values -> ([b, r] whitened advantages, [b, r] returns) by GAE(gamma, lam)."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.loss (reward whitening, GAE, returns, whitening)
    if whiten_rewards:
        rewards = whiten_in_groups(rewards, whiten_group_size, shift_mean=False)
    response_length = rewards.shape[1]
    lastgaelam = torch.zeros_like(rewards[:, 0])  # [b]
    advantages_reversed = []
    for t in reversed(range(response_length)):
        nextvalues = values[:, t + 1] if t < response_length - 1 else 0.0  # [b]; 0 after the last token
        delta = rewards[:, t] + gamma * nextvalues - values[:, t]  # [b]
        lastgaelam = delta + gamma * lam * lastgaelam  # [b]
        advantages_reversed.append(lastgaelam)
    advantages = torch.stack(advantages_reversed[::-1], dim=1)  # [b, r]
    returns = advantages + values  # [b, r]
    # the original asserts >= 8 episodes only with whiten_rewards; advantages are always whitened,
    # e.g. over 4 episodes per rank for tldr, so no minimum applies here
    advantages = whiten_in_groups(advantages, whiten_group_size, min_group_size=1)
    return advantages.detach(), returns


# ---------------------------------------------------------------------------------------------
# E6 value loss, E7 policy loss: clipped value and policy losses
# ---------------------------------------------------------------------------------------------


def value_loss(
    vpred: torch.Tensor, values: torch.Tensor, returns: torch.Tensor, cliprange_value: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, r] vpred, values, returns -> (scalar vf_loss, scalar vf_clipfrac)."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.loss (vf_loss, vf_clipfrac)
    vpredclipped = torch.clamp(vpred, values - cliprange_value, values + cliprange_value)  # [b, r]
    vf_losses1 = (vpred - returns) ** 2  # [b, r]
    vf_losses2 = (vpredclipped - returns) ** 2  # [b, r]
    vf_loss = 0.5 * torch.maximum(vf_losses1, vf_losses2).mean()
    vf_clipfrac = (vf_losses2 > vf_losses1).float().mean()
    return vf_loss, vf_clipfrac


def policy_loss(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, cliprange: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[b, r] logprobs, old_logprobs, advantages -> (scalar pg_loss, scalar pg_clipfrac, scalar approxkl)."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.loss (pg_loss, pg_clipfrac, approxkl)
    ratio = torch.exp(logprobs - old_logprobs)  # [b, r]
    pg_losses = -advantages * ratio  # [b, r]
    pg_losses2 = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)  # [b, r]
    pg_loss = torch.maximum(pg_losses, pg_losses2).mean()
    pg_clipfrac = (pg_losses2 > pg_losses).float().mean()
    approxkl = 0.5 * ((logprobs - old_logprobs) ** 2).mean().detach()
    return pg_loss, pg_clipfrac, approxkl
