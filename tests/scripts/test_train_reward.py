"""FIDELITY D2 (best-of-N loss), D3 (divisibility), D4 (annealed lr), D6/D7 (normalisation)."""

import math
from types import SimpleNamespace

import pytest
import torch

import train_reward
from lm_human_preference_details.language.model import RewardModel, load_lm
from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.utils.errors import UserError


def test_best_of_n_loss_by_hand():
    # rewards [0, ln 2, 0, 0], best 1: softmax of best = 2 / (1 + 2 + 1 + 1) = 0.4 -> loss = -ln 0.4
    # second row: rewards [3, 0, 0, 0], best 2: p = 1 / (e^3 + 3) -> loss = ln(e^3 + 3); argmax 0 != 2 -> wrong
    rewards = torch.tensor([[0.0, math.log(2.0), 0.0, 0.0], [3.0, 0.0, 0.0, 0.0]])
    loss, accuracy = train_reward.best_of_n_loss(rewards, torch.tensor([1, 2]))
    assert loss.item() == pytest.approx((-math.log(0.4) + math.log(math.exp(3) + 3)) / 2, rel=1e-6)
    assert accuracy.item() == 0.5


def test_annealed_lr_by_hand():
    # 4992 labels in batches of 32: the batch at 0 gets lr, at 2496 lr / 2, the last (4960) lr * 32 / 4992
    assert train_reward.annealed_lr(5e-5, 0, 4992) == 5e-5
    assert train_reward.annealed_lr(5e-5, 2496, 4992) == pytest.approx(2.5e-5)
    assert train_reward.annealed_lr(5e-5, 4960, 4992) == pytest.approx(5e-5 * 32 / 4992)


def test_num_train_must_divide_by_batch_size():
    args = train_reward.build_args("sentiment")
    args.labels.num_train = 100
    with pytest.raises(UserError, match=r"labels.num_train \(100\) must be divisible by batch_size \(32\)"):
        args.finalize()


@pytest.mark.parametrize("task, batch, lr, rollout, num_train", [
    ("sentiment", 32, 5e-5, 512, 4992), ("descriptiveness", 32, 5e-5, 512, 4992),
    ("tldr", 16, 2.5e-5, 128, 46000), ("cnndm", 16, 2.5e-5, 128, 46000),
])
def test_presets_match_reference(task, batch, lr, rollout, num_train):
    args = train_reward.build_args(task).finalize(check_inputs=False)
    assert (args.batch_size, args.lr, args.rollout_batch_size, args.labels.num_train) == (batch, lr, rollout, num_train)
    assert args.normalize_samples == 256 and args.normalize_before and args.normalize_after and args.label_n == 4


class FakeSampler:
    """Hands out query batches and counts them."""

    def __init__(self, batch_size):
        self.batch_size, self.calls = batch_size, 0

    def __next__(self):
        self.calls += 1
        return torch.full((self.batch_size, 3), 464)


class FakePolicy(torch.nn.Module):
    """Responses whose first token carries the sample's index, so rewards can be chosen exactly."""

    def __init__(self):
        super().__init__()
        self.head = torch.nn.Linear(1, 1)
        self.count = 0

    def sample(self, contexts, length, uniforms=None):
        ids = torch.arange(self.count, self.count + len(contexts))
        self.count += len(contexts)
        return {"responses": ids[:, None].expand(len(contexts), length)}


class FakeReward:
    def score(self, queries, responses):
        return responses[:, 0].double() % 2 * 4.0  # alternating 0, 4, 0, 4 ...: mean 2, population std 2


def test_reward_stats_uses_ceil_batches_and_population_std():
    # D6: normalize_samples 100 with rollout_batch_size 64 -> ceil(100/64) = 2 batches = 128 samples
    args = train_reward.build_args("sentiment")
    args.rollout_batch_size, args.task.response_length = 64, 2
    sampler, policy = FakeSampler(64), FakePolicy()
    mean, std = train_reward.reward_stats(FakeReward(), policy, sampler, args, 100, [], [], Ranks(args.num_ranks, seed=0))
    assert sampler.calls == 2 and policy.count == 128
    assert mean == 2.0 and std == 2.0  # sample std would be 2 * sqrt(128/127)


def test_normalize_resets_then_sets_gain_and_bias(tiny_model_dir):
    model = RewardModel(load_lm(str(tiny_model_dir)), 50257)
    with torch.no_grad():
        model.gain.fill_(3.0)  # a previous normalisation: must be reset before measuring (D7)
    seen = []

    def stats_fn(n):
        seen.append((n, model.gain.item(), model.bias.item()))
        return 5.0, 0.5  # rewards measured at 5 +- 0.5

    args = SimpleNamespace(normalize_samples=256, debug_normalize=0)
    out = train_reward.normalize(model, stats_fn, args, target_mean=0.0, target_std=1.0)
    assert seen == [(256, 1.0, 0.0)]
    # gain = 1 / 0.5 = 2, bias = 0 - 2 * 5 = -10
    assert model.gain.item() == 2.0 and model.bias.item() == -10.0
    assert out == {"mean_before": 5.0, "std_before": 0.5, "gain": 2.0, "bias": -10.0}
