"""FIDELITY C3, E2-E8: the tensor maths of PPO against hand-worked values and naive loop transcriptions."""

import math

import numpy as np
import pytest
import torch

from lm_human_preference_details.optim import annealed_lr
from lm_human_preference_details.ppo import (
    AdaptiveKLController,
    FixedKLController,
    apply_rejection,
    compute_advantages,
    entropy_from_logits,
    kl_rewards,
    logprobs_from_logits,
    policy_loss,
    responses_pass_filter,
    truncate_responses,
    value_loss,
    whiten_in_groups,
)

PAD = 50257
DOT = 13  # '.', the books tasks' truncate_token


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


# ---------------------------------------------------------------------------------------------
# C3: log-probs and entropies
# ---------------------------------------------------------------------------------------------


def test_logprobs_and_entropy_by_hand():
    # logits [0, ln 3] -> softmax [1/4, 3/4]; log p(label 1) = ln 0.75 = -0.2876821
    # entropy = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.3465736 + 0.2157616 = 0.5623351
    # (two more tokens at logit -30 carry e^-30 ~ 1e-13 of the mass: negligible)
    # uniform logits over 4 tokens: log p = -ln 4, entropy = ln 4
    logits = torch.tensor([[[0.0, math.log(3.0), -30.0, -30.0], [2.0, 2.0, 2.0, 2.0]]], dtype=torch.float16)
    labels = torch.tensor([[1, 3]])
    logprobs = logprobs_from_logits(logits, labels)
    entropies = entropy_from_logits(logits)
    assert logprobs.dtype == entropies.dtype == torch.float32
    assert logprobs.shape == entropies.shape == (1, 2)
    assert logprobs[0, 0].item() == pytest.approx(-0.2876821, abs=1e-3)  # ln 3 is rounded to float16
    assert logprobs[0, 1].item() == pytest.approx(-math.log(4), abs=1e-6)
    assert entropies[0, 0].item() == pytest.approx(0.5623351, abs=1e-3)
    assert entropies[0, 1].item() == pytest.approx(math.log(4), abs=1e-6)


def test_logprobs_and_entropy_match_naive_loops():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 7, generator=g) * 3
    labels = torch.randint(0, 7, (2, 3), generator=g)
    logprobs, entropies = logprobs_from_logits(logits, labels), entropy_from_logits(logits)
    for i in range(2):
        for t in range(3):
            row = [float(v) for v in logits[i, t]]
            z = sum(math.exp(v) for v in row)
            p = [math.exp(v) / z for v in row]
            assert logprobs[i, t].item() == pytest.approx(math.log(p[labels[i, t]]), abs=1e-5)
            assert entropies[i, t].item() == pytest.approx(-sum(q * math.log(q) for q in p), abs=1e-5)


# ---------------------------------------------------------------------------------------------
# E2: truncation, filter, rejection
# ---------------------------------------------------------------------------------------------

RESPONSES = torch.tensor(
    [
        [5, DOT, 7, DOT, 9, DOT],  # '.' at 1 (< truncate_after) ignored; first '.' at >= 2 is index 3
        [DOT, DOT, 4, 4, 4, 4],  # '.' only before index 2: untouched, and fails the filter
        [1, 2, DOT, 3, 4, 5],  # '.' exactly at truncate_after = 2
        [1, 2, 3, 4, 5, DOT],  # '.' at the last index: nothing after it to pad
    ]
)


def test_truncate_responses_by_hand():
    out = truncate_responses(RESPONSES, truncate_token=DOT, truncate_after=2, pad_id=PAD)
    expected = torch.tensor(
        [
            [5, DOT, 7, DOT, PAD, PAD],  # the truncate token itself stays, the later '.' becomes pad
            [DOT, DOT, 4, 4, 4, 4],
            [1, 2, DOT, PAD, PAD, PAD],
            [1, 2, 3, 4, 5, DOT],
        ]
    )
    assert torch.equal(out, expected)
    assert RESPONSES[0, 4] == 9  # the input is not modified


def test_truncate_after_zero_and_none():
    # truncate_after = 0: the '.' at index 1 of row 1 now counts, so indices 2.. become pad
    out = truncate_responses(RESPONSES, truncate_token=DOT, truncate_after=0, pad_id=PAD)
    assert out[0].tolist() == [5, DOT, PAD, PAD, PAD, PAD]
    assert out[1].tolist() == [DOT, PAD, PAD, PAD, PAD, PAD]
    assert torch.equal(truncate_responses(RESPONSES, None, 2, PAD), RESPONSES)


def test_truncate_matches_naive_loop():
    g = torch.Generator().manual_seed(1)
    responses = torch.randint(10, 16, (64, 12), generator=g)  # '.' (13) appears often
    for after in (0, 3, 11, 20):
        out = truncate_responses(responses, DOT, after, PAD)
        for i in range(64):
            row = responses[i].tolist()
            cut = next((t for t in range(after, len(row)) if row[t] == DOT), None)
            expected = row if cut is None else row[: cut + 1] + [PAD] * (len(row) - cut - 1)
            assert out[i].tolist() == expected


def test_filter_and_rejection_by_hand():
    passed = responses_pass_filter(RESPONSES, truncate_token=DOT, truncate_after=2)
    assert passed.tolist() == [True, False, True, True]  # row 1's '.'s are all before index 2
    # the original filters the truncated responses; truncation keeps that token, so it agrees
    truncated = truncate_responses(RESPONSES, DOT, 2, PAD)
    assert torch.equal(responses_pass_filter(truncated, DOT, 2), passed)
    scores = torch.tensor([0.5, 0.7, -0.3, 2.0])
    assert apply_rejection(scores, passed, -1.0).tolist() == [0.5, -1.0, pytest.approx(-0.3), 2.0]
    # no truncate token configured: everything passes, nothing is penalised
    all_pass = responses_pass_filter(RESPONSES, None, 2)
    assert all_pass.dtype == torch.bool and all_pass.tolist() == [True] * 4
    assert torch.equal(apply_rejection(scores, all_pass, -1.0), scores)


# ---------------------------------------------------------------------------------------------
# E3: rewards
# ---------------------------------------------------------------------------------------------


def test_kl_rewards_by_hand():
    # row 0: kl = [-1 - -1.5, -2 - -1, -3 - -3.5] = [0.5, -1, 0.5]
    #        non_score_reward = -0.1 * kl = [-0.05, 0.1, -0.05]; score 2 at the last token -> 1.95
    # row 1: kl = 0 everywhere; score -1 at the last token
    logprobs = f64([[-1.0, -2.0, -3.0], [-0.5, -0.5, -0.5]])
    ref_logprobs = f64([[-1.5, -1.0, -3.5], [-0.5, -0.5, -0.5]])
    scores = f64([2.0, -1.0])
    rewards, non_score_reward, kl = kl_rewards(scores, logprobs, ref_logprobs, kl_coef=0.1)
    torch.testing.assert_close(kl, f64([[0.5, -1.0, 0.5], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(non_score_reward, f64([[-0.05, 0.1, -0.05], [0.0, 0.0, 0.0]]))
    torch.testing.assert_close(rewards, f64([[-0.05, 0.1, 1.95], [0.0, 0.0, -1.0]]))


# ---------------------------------------------------------------------------------------------
# E4: KL controllers
# ---------------------------------------------------------------------------------------------


def test_adaptive_kl_controller_steps_by_hand():
    # sentiment preset: init 0.15, target 6, horizon 10000, n_steps = batch_size 512 -> 512/10000 = 0.0512
    ctl = AdaptiveKLController(0.15, target=6.0, horizon=10000)
    # kl 9:   9/6 - 1 = 0.5, clipped to +0.2: 0.15 * (1 + 0.2 * 0.0512) = 0.15 * 1.01024 = 0.151536
    ctl.update(9.0, 512)
    assert ctl.value == pytest.approx(0.151536, rel=1e-12)
    # kl 6.6: 6.6/6 - 1 = 0.1 (no clip): 0.151536 * 1.00512 = 0.15231186432
    ctl.update(6.6, 512)
    assert ctl.value == pytest.approx(0.15231186432, rel=1e-12)
    # kl 0:   0/6 - 1 = -1, clipped to -0.2: 0.15231186432 * 0.98976 = 0.15075219082936...
    ctl.update(0.0, 512)
    assert ctl.value == pytest.approx(0.1507521908293632, rel=1e-12)
    # kl 5.4: 5.4/6 - 1 = -0.1: * 0.99488 = 0.14998033961231...
    ctl.update(5.4, 512)
    assert ctl.value == pytest.approx(0.1499803396123169, rel=1e-12)
    # kl on target: err 0, unchanged
    ctl.update(6.0, 512)
    assert ctl.value == pytest.approx(0.1499803396123169, rel=1e-12)


def test_fixed_kl_controller():
    ctl = FixedKLController(0.03)
    for kl in (0.0, 15.0, 1e6):
        ctl.update(kl, 32)
    assert ctl.value == 0.03


# ---------------------------------------------------------------------------------------------
# E5: whitening and GAE
# ---------------------------------------------------------------------------------------------


def whiten(x: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """One group, as whiten_in_groups whitens it: every element of ``x`` together, whatever the group size."""
    return whiten_in_groups(x.reshape(1, -1), None, shift_mean, min_group_size=1).reshape(x.shape)


def naive_whiten(x: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Loop transcription of OAI utils/core.py whiten: mean and population variance over every element."""
    values = x.flatten().tolist()
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / len(values)
    out = [(v - mean) / math.sqrt(var + 1e-8) + (0.0 if shift_mean else mean) for v in values]
    return torch.tensor(out, dtype=x.dtype).reshape(x.shape)


def test_whiten_by_hand():
    # [1, 2, 3, 4]: mean 2.5; deviations [-1.5, -0.5, 0.5, 1.5]; squares sum to 5 -> var 5/4 = 1.25
    # (population variance); rsqrt(1.25 + 1e-8) = 0.894427187 -> [-1.3416408, -0.4472136, 0.4472136, 1.3416408]
    x = f64([1.0, 2.0, 3.0, 4.0])
    torch.testing.assert_close(whiten(x), f64([-1.3416407811, -0.4472135937, 0.4472135937, 1.3416407811]))
    # shift_mean=False adds the mean 2.5 back: scaled to unit variance, mean kept
    torch.testing.assert_close(
        whiten(x, shift_mean=False), f64([1.1583592189, 2.0527864063, 2.9472135937, 3.8416407811])
    )
    # over all elements of a 2-D tensor alike
    torch.testing.assert_close(whiten(x.reshape(2, 2)), whiten(x).reshape(2, 2))
    torch.testing.assert_close(whiten_in_groups(x.reshape(4, 1), None, min_group_size=1), whiten(x).reshape(4, 1))


def _two_groups():
    g = torch.Generator().manual_seed(2)
    first = torch.randn(8, 5, generator=g, dtype=torch.float64)
    second = 3.0 + 5.0 * torch.randn(8, 5, generator=g, dtype=torch.float64)  # other mean and scale
    return torch.cat([first, second])  # [16, 5]


@pytest.mark.parametrize("shift_mean", [True, False])
def test_grouped_whitening_is_per_group(shift_mean):
    x = _two_groups()
    out = whiten_in_groups(x, 8, shift_mean=shift_mean)
    per_group = torch.cat([naive_whiten(x[:8], shift_mean), naive_whiten(x[8:], shift_mean)])
    torch.testing.assert_close(out, per_group)
    assert not torch.allclose(out, naive_whiten(x, shift_mean))  # whole-batch whitening is different
    torch.testing.assert_close(whiten_in_groups(x, None, shift_mean), naive_whiten(x, shift_mean))
    torch.testing.assert_close(whiten_in_groups(x, 16, shift_mean), naive_whiten(x, shift_mean))


def test_grouped_whitening_errors():
    x = torch.zeros(16, 3)
    with pytest.raises(ValueError, match="divide"):
        whiten_in_groups(x, 6)  # 16 rows do not split into groups of 6
    with pytest.raises(ValueError, match="minimum of 8"):
        whiten_in_groups(x, 4)  # the original's assert: >= 8 episodes per rank's minibatch
    with pytest.raises(ValueError, match="minimum of 8"):
        whiten_in_groups(torch.zeros(4, 3), None)
    assert whiten_in_groups(x, 4, min_group_size=1).shape == (16, 3)


def test_gae_by_hand():
    # gamma 1, lam 0.95, one episode, rewards [0, 0, 1], values [0.1, 0.2, 0.3]:
    # t=2: delta = 1 + 1 * 0 (after the last token) - 0.3 = 0.7;  A2 = 0.7
    # t=1: delta = 0 + 0.3 - 0.2 = 0.1;                           A1 = 0.1 + 0.95 * 0.7 = 0.765
    # t=0: delta = 0 + 0.2 - 0.1 = 0.1;                           A0 = 0.1 + 0.95 * 0.765 = 0.82675
    # returns = A + values = [0.92675, 0.965, 1.0]
    # whitened A: mean 0.76391667, var 0.00267818 -> [1.2141417, 0.0209335, -1.2350751]
    rewards = f64([[0.0, 0.0, 1.0]])
    values = f64([[0.1, 0.2, 0.3]])
    advantages, returns = compute_advantages(rewards, values, 1.0, 0.95, whiten_group_size=None, whiten_rewards=False)
    torch.testing.assert_close(returns, f64([[0.92675, 0.965, 1.0]]))
    torch.testing.assert_close(advantages, f64([[1.2141416648, 0.0209334770, -1.2350751418]]))
    assert rewards.tolist() == [[0.0, 0.0, 1.0]]  # not modified


def naive_oai_advantages(rewards, values, gamma, lam, ranks, whiten_rewards):
    """Each simulated rank whitens its own rows, as the TF loss did per MPI rank; plain loops throughout."""
    rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
    b, r = rewards.shape
    per_rank = b // ranks
    adv_out, ret_out = np.zeros((b, r)), np.zeros((b, r))

    def moments(a):
        flat = [v for row in a for v in row]
        mean = sum(flat) / len(flat)
        return mean, sum((v - mean) ** 2 for v in flat) / len(flat)

    for k in range(ranks):
        rows = slice(k * per_rank, (k + 1) * per_rank)
        rew, val = rewards[rows].copy(), values[rows]
        if whiten_rewards:
            mean, var = moments(rew)
            rew = (rew - mean) / math.sqrt(var + 1e-8) + mean
        adv = np.zeros_like(rew)
        for i in range(per_rank):
            lastgaelam = 0.0
            for t in reversed(range(r)):
                nextvalue = val[i, t + 1] if t < r - 1 else 0.0
                delta = rew[i, t] + gamma * nextvalue - val[i, t]
                lastgaelam = delta + gamma * lam * lastgaelam
                adv[i, t] = lastgaelam
        ret_out[rows] = adv + val
        mean, var = moments(adv)
        adv_out[rows] = (adv - mean) / math.sqrt(var + 1e-8)
    return adv_out, ret_out


@pytest.mark.parametrize("whiten_rewards", [True, False])
@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.5)])
def test_compute_advantages_matches_naive_per_rank_loop(whiten_rewards, gamma, lam):
    g = torch.Generator().manual_seed(3)
    rewards = torch.randn(32, 6, generator=g, dtype=torch.float64)
    rewards[:, -1] += 4 * torch.randn(32, generator=g, dtype=torch.float64)  # scores at the last token
    values = torch.randn(32, 6, generator=g, dtype=torch.float64)
    advantages, returns = compute_advantages(rewards, values, gamma, lam, 8, whiten_rewards)
    naive_adv, naive_ret = naive_oai_advantages(rewards.numpy(), values.numpy(), gamma, lam, 4, whiten_rewards)
    np.testing.assert_allclose(advantages.numpy(), naive_adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(returns.numpy(), naive_ret, rtol=1e-10, atol=1e-10)
    whole_adv, _ = compute_advantages(rewards, values, gamma, lam, None, whiten_rewards)
    assert not torch.allclose(advantages, whole_adv)


def test_compute_advantages_minimum_only_with_reward_whitening():
    rewards, values = torch.randn(8, 4), torch.randn(8, 4)
    # tldr: 4 episodes per rank, whiten_rewards off -> allowed, advantages still whitened per 4
    advantages, _ = compute_advantages(rewards, values, 1.0, 0.95, 4, whiten_rewards=False)
    assert abs(advantages[:4].mean().item()) < 1e-5 and abs(advantages[4:].mean().item()) < 1e-5
    with pytest.raises(ValueError, match="minimum of 8"):
        compute_advantages(rewards, values, 1.0, 0.95, 4, whiten_rewards=True)


# ---------------------------------------------------------------------------------------------
# E6, E7: losses
# ---------------------------------------------------------------------------------------------


def test_value_loss_clipping_both_sides_by_hand():
    # values 0, cliprange_value 0.2 -> vpred is clipped into [-0.2, 0.2]
    # 0: vpred  0.5 -> 0.2,  returns  1: l1 = 0.25, l2 = (0.2 - 1)^2 = 0.64   -> 0.64, clipped (above)
    # 1: vpred -0.5 -> -0.2, returns -1: l1 = 0.25, l2 = (-0.2 + 1)^2 = 0.64  -> 0.64, clipped (below)
    # 2: vpred  0.1 inside,  returns  0: l1 = l2 = 0.01                        -> 0.01, not counted
    # 3: vpred  0.5 -> 0.2,  returns  0: l1 = 0.25, l2 = 0.04                  -> 0.25, not counted (l2 < l1)
    # vf_loss = 0.5 * (0.64 + 0.64 + 0.01 + 0.25) / 4 = 0.5 * 0.385 = 0.1925; vf_clipfrac = 2 / 4
    vpred = f64([[0.5, -0.5], [0.1, 0.5]]).requires_grad_()
    values = torch.zeros(2, 2, dtype=torch.float64)
    returns = f64([[1.0, -1.0], [0.0, 0.0]])
    vf_loss, vf_clipfrac = value_loss(vpred, values, returns, 0.2)
    assert vf_loss.item() == pytest.approx(0.1925)
    assert vf_clipfrac.item() == 0.5
    # the clipped branch carries no gradient; elsewhere d/dvpred = 0.5 * 2 * (vpred - returns) / 4
    vf_loss.backward()
    torch.testing.assert_close(vpred.grad, f64([[0.0, 0.0], [0.025, 0.125]]))


def test_policy_loss_clipping_both_signs_by_hand():
    # cliprange 0.2 -> the ratio is clipped into [0.8, 1.2]
    # A=+1, ratio 1.5: -1.5 vs -1.2 -> -1.2, clipped  (no credit beyond 1 + eps for a good action)
    # A=+1, ratio 0.5: -0.5 vs -0.8 -> -0.5, not clipped
    # A=-1, ratio 0.5:  0.5 vs  0.8 ->  0.8, clipped  (no credit below 1 - eps for a bad action)
    # A=-1, ratio 1.5:  1.5 vs  1.2 ->  1.5, not clipped
    # pg_loss = (-1.2 - 0.5 + 0.8 + 1.5) / 4 = 0.15; pg_clipfrac = 2 / 4
    # approxkl = 0.5 * mean(ln(ratio)^2) = 0.5 * (0.1644020 + 0.4804530 + 0.4804530 + 0.1644020) / 4 = 0.1612137
    old_logprobs = f64([[-1.0, -1.0], [-2.0, -2.0]])
    logprobs = (old_logprobs + torch.log(f64([[1.5, 0.5], [0.5, 1.5]]))).requires_grad_()
    advantages = f64([[1.0, 1.0], [-1.0, -1.0]])
    pg_loss, pg_clipfrac, approxkl = policy_loss(logprobs, old_logprobs, advantages, 0.2)
    assert pg_loss.item() == pytest.approx(0.15)
    assert pg_clipfrac.item() == 0.5
    assert approxkl.item() == pytest.approx(0.1612137420, rel=1e-9)
    # clipped elements carry no gradient; elsewhere d/dlogprob = -A * ratio / 4
    pg_loss.backward()
    torch.testing.assert_close(logprobs.grad, f64([[0.0, -0.125], [0.0, 0.375]]))


def test_policy_loss_at_ratio_one():
    # a fresh minibatch (logprobs == old_logprobs): loss = -mean(A), nothing clipped, approxkl 0
    lp = f64([[-1.0, -2.0, -0.5]])
    pg_loss, pg_clipfrac, approxkl = policy_loss(lp, lp, f64([[0.3, -0.9, 1.5]]), 0.2)
    assert pg_loss.item() == pytest.approx(-0.3)
    assert pg_clipfrac.item() == 0.0 and approxkl.item() == 0.0


# ---------------------------------------------------------------------------------------------
# E8: learning rate
# ---------------------------------------------------------------------------------------------


def test_annealed_lr():
    # sentiment: lr 1e-5, n_updates = ceil(1e6 / 512) = 1954
    assert annealed_lr(1e-5, 0, 1954) == 1e-5
    assert annealed_lr(1e-5, 977, 1954) == pytest.approx(5e-6)  # halfway
    assert annealed_lr(1e-5, 1953, 1954) == pytest.approx(1e-5 / 1954)  # last update, never 0
