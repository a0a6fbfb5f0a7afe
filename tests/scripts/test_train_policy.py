"""train_policy.py pieces: sizes and checks, per-rank minibatches, the PPO epochs' statistics, bf16, the reward run."""

import math

import pytest
import torch
from helpers.ppo import ppo_args, rollout_data

import train_policy
from lm_human_preference_details.language.model import Policy, RewardModel, load_lm
from lm_human_preference_details.optim import TF1Adam
from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.utils.errors import UserError

PAD = 50257


@pytest.mark.parametrize("task, batch, lr, kl_coef, adaptive, whiten", [
    ("sentiment", 512, 1e-5, 0.15, True, True), ("descriptiveness", 512, 1e-5, 0.15, True, True),
    ("tldr", 32, 2e-6, 0.03, False, False), ("cnndm", 32, 2e-6, 0.01, False, False),
])
def test_presets_match_reference(task, batch, lr, kl_coef, adaptive, whiten):
    args = train_policy.build_args(task).finalize(check_inputs=False)
    assert (args.ppo.batch_size, args.ppo.lr, args.rewards.kl_coef, args.rewards.adaptive_kl) == (batch, lr, kl_coef, adaptive)
    assert args.ppo.whiten_rewards == whiten and args.ppo.total_episodes == 1_000_000
    assert (args.ppo.noptepochs, args.ppo.nminibatches, args.ppo.vf_coef, args.ppo.cliprange) == (4, 1, 0.1, 0.2)
    assert (args.ppo.gamma, args.ppo.lam, args.rewards.target, args.rewards.horizon) == (1.0, 0.95, 6.0, 10000)
    assert args.n_updates == math.ceil(1_000_000 / batch)  # E8: 1954 updates for sentiment
    # E5: the original's 8 ranks each whitened its own minibatch: 64 episodes for books, 4 for tldr
    assert args.rank_minibatch_size == batch // 8


@pytest.mark.parametrize("task, dataset, start, end", [
    ("sentiment", "bookcorpus", None, None), ("descriptiveness", "bookcorpus", None, None),  # fork commit cbdfd00
    ("tldr", "tldr-17", None, None), ("cnndm", "cnndm", None, "\n"),  # the fork's tldr; OpenAI's cnndm files
])
def test_presets_default_to_the_baselines_query_sources(task, dataset, start, end):
    args = train_policy.build_args(task).finalize(check_inputs=False)
    assert (args.task.query_dataset, args.task.start_text, args.task.end_text) == (dataset, start, end)
    assert args.rewards.train_new_model.labels.source.endswith(f"/labels/{task}/" + (
        "offline_5k.json" if task in ("sentiment", "descriptiveness") else "online_45k.json"))


def test_the_2019_pipeline_is_one_switch():
    from lm_human_preference_details.cli.parsing import parse_args

    argv = ["--task", "sentiment", "--task.query-dataset", "books-2019"]
    args = parse_args(train_policy.build_args, "", argv).finalize(check_inputs=False)
    assert (args.task.query_dataset, args.task.start_text, args.task.end_text) == ("books-2019", ".", ".")  # launch.py
    args = parse_args(train_policy.build_args, "", ["--task.query-dataset", "books-2019", "--task.end-text", "None"])
    assert (args.finalize(check_inputs=False).task.start_text, args.task.end_text) == (".", None)  # an explicit choice
    argv = ["--task", "tldr", "--task.query-dataset", "tldr-2019"]
    args = parse_args(train_policy.build_args, "", argv).finalize(check_inputs=False)
    assert (args.task.start_text, args.task.end_text) == (None, None)  # launch.py tldr: no start/end text


def test_finalize_rejects_bad_sizes():
    args = train_policy.build_args("sentiment")
    args.ppo.nminibatches = 3
    with pytest.raises(UserError, match=r"batch_size \(512\) must be divisible by ppo.nminibatches \(3\)"):
        args.finalize()
    args = train_policy.build_args("sentiment")
    args.ppo.batch_size = 32
    with pytest.raises(UserError, match="reward whitening groups hold 4 episodes"):
        args.finalize()
    args = train_policy.build_args("sentiment")
    args.micro_batch_sequences = 48
    with pytest.raises(UserError, match="--micro-batch-sequences"):
        args.finalize()


def test_a_penalty_that_is_not_a_finite_score_is_one_line():
    from lm_human_preference_details.tasks import check_task

    for value in (math.nan, math.inf):
        args = train_policy.build_args("sentiment")
        args.task.penalty_reward_value = value
        with pytest.raises(UserError, match=rf"--task.penalty-reward-value is {value}; pass a finite score"):
            check_task(args.task)


def test_minibatches_keep_each_rank_together():
    args = train_policy.build_args("sentiment")
    args.ppo.batch_size, args.ppo.nminibatches, args.num_ranks = 32, 2, 2
    args.finalize(check_inputs=False)  # rank share 16, per-rank minibatch 8
    mbs = train_policy.minibatch_indices(Ranks(2, seed=0), args)
    assert len(mbs) == 2 and all(len(mb) == 16 for mb in mbs)
    assert sorted(torch.cat(mbs).tolist()) == list(range(32))  # every episode once per epoch
    for mb in mbs:  # first 8 from rank 0 (episodes 0-15), next 8 from rank 1 (16-31)
        assert (mb[:8] < 16).all() and (mb[8:] >= 16).all()


def test_first_ratio_is_one_and_policy_moves(tiny_model_dir):
    torch.manual_seed(0)
    policy = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    data = rollout_data(policy)
    before = [p.detach().clone() for p in policy.parameters()]
    args = ppo_args(0)
    args.ppo.noptepochs = 2
    stats = train_policy.ppo_epochs(policy, TF1Adam(policy.parameters(), lr=1e-3), data, args, Ranks(2, seed=0))
    # the first minibatch of the first epoch sees the rollout's own policy: ratio 1, approxkl 0, no clipping
    assert stats[0]["policy/approxkl"] < 1e-10 and stats[0]["policy/clipfrac"] == 0.0
    assert stats[1]["policy/approxkl"] > 0  # the second epoch sees an updated policy
    assert any(not torch.equal(a, b) for a, b in zip(before, policy.parameters()))


def test_update_stats_names_and_values():
    args = train_policy.build_args("sentiment").finalize(check_inputs=False)
    data = {
        "logprobs": torch.tensor([[-1.0, -2.0], [-0.5, -0.5]]),
        "ref_logprobs": torch.tensor([[-1.5, -2.0], [-1.0, -1.5]]),
        "scores": torch.tensor([1.0, 3.0]),
        "non_score_reward": torch.tensor([[-0.1, 0.0], [-0.1, -0.2]]),
    }
    data["kl"] = data["logprobs"] - data["ref_logprobs"]  # as the rollout returns it
    train_stats = [{"val/error": 1.0, "returns/var": 4.0, "loss/policy": 0.5},
                   {"val/error": 3.0, "returns/var": 4.0, "loss/policy": 1.5}]
    stats = train_policy.update_stats(data, train_stats, 0.15, 9, args, elapsed=100.0, delta=2.0,
                                      ranks=Ranks(8, seed=0))
    # kl per response: 0.5 + 0 = 0.5 and 0.5 + 1 = 1.5 -> mean 1.0; entropy: (3 + 1) / 2 = 2
    assert stats["ppo/objective/kl"] == 1.0 and stats["ppo/objective/entropy"] == 2.0
    assert stats["ppo/objective/score"] == 2.0
    assert stats["ppo/objective/score_total"] == pytest.approx(2.0 + (-0.1 - 0.3) / 2)
    assert stats["ppo/objective/kl_coef"] == 0.15
    assert stats["ppo/ppo/val/error"] == 2.0 and stats["ppo/ppo/loss/policy"] == 1.0
    assert stats["ppo/ppo/val/var_explained"] == 1 - 2.0 / 4.0
    # step 9 -> 10 updates done: 5120 episodes, 240 serial steps, 122880 total steps, fps 512*24/2
    assert stats["ppo/elapsed/updates"] == 10 and stats["ppo/elapsed/episodes"] == 5120
    assert stats["ppo/elapsed/steps/serial"] == 240 and stats["ppo/elapsed/steps/total"] == 122880
    assert stats["ppo/elapsed/fps"] == 6144 and stats["ppo/elapsed/time"] == 100.0


def test_returns_and_value_variances_are_per_rank_means(tiny_model_dir):
    # the original's ranks each took tf.nn.moments of their own minibatch; the logged value is the ranks' mean
    torch.manual_seed(0)
    policy = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    data = rollout_data(policy)
    data["values"] = torch.cat([torch.zeros(8, 5), torch.full((8, 5), 10.0)])  # rank 0: all 0, rank 1: all 10
    stats = train_policy.ppo_epochs(policy, TF1Adam(policy.parameters(), lr=0.0), data, ppo_args(0), Ranks(2, seed=0))
    assert stats[0]["val/mean"] == 5.0
    assert stats[0]["val/var"] == 0.0  # per rank 0 and 0; over the whole minibatch it would be 25


def test_bf16_autocast_keeps_the_maths_close(tiny_model_dir):
    # --bf16 is a documented numerics deviation: the same update in bf16 autocast stays close to fp32
    results = []
    for bf16 in (False, True):
        torch.manual_seed(0)
        policy = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
        data = rollout_data(policy)
        args = ppo_args(0)
        args.bf16 = bf16
        stats = train_policy.ppo_epochs(policy, TF1Adam(policy.parameters(), lr=1e-3), data, args, Ranks(2, seed=0))
        results.append(stats[0])
    assert results[0]["policy/entropy"] == pytest.approx(results[1]["policy/entropy"], rel=0.05)
    assert results[0]["loss/value"] == pytest.approx(results[1]["loss/value"], rel=0.05)


def test_bf16_epochs_after_the_first_step_see_the_new_weights(tiny_model_dir):
    # autocast keeps its bf16 weight copies until its context exits: one context around the PPO epochs ran every epoch
    # after the first on the weights from before the first step (the second epoch's ratio stayed 1)
    approxkl = {}
    for bf16 in (False, True):
        torch.manual_seed(0)
        policy = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
        data = rollout_data(policy)
        args = ppo_args(0)
        args.ppo.noptepochs, args.ppo.lr, args.bf16 = 2, 1e-2, bf16
        stats = train_policy.ppo_epochs(policy, TF1Adam(policy.parameters(), lr=1e-2), data, args, Ranks(2, seed=0))
        approxkl[bf16] = [s["policy/approxkl"] for s in stats]
    assert approxkl[False][1] > 100 * abs(approxkl[False][0])  # the step moved the policy away from the rollout's
    assert approxkl[True][1] == pytest.approx(approxkl[False][1], rel=0.2)


def test_bf16_sampling_and_scoring_stay_close_to_fp32(tiny_model_dir):
    # --bf16 wraps the rollout too: the KV cache holds bfloat16 keys and values; log-probs, values and rewards
    # stay near the fp32 computation of the same tokens
    torch.manual_seed(0)
    policy = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    torch.nn.init.normal_(policy.head.weight, std=0.1)
    reward_model = RewardModel(load_lm(str(tiny_model_dir)), PAD)
    contexts = torch.tensor([[464, 3290, PAD, PAD, 318, 13], [40, 588, 13, PAD, PAD, PAD]])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = policy.sample(contexts, 6, generator=torch.Generator().manual_seed(0))
        scores = reward_model.score(contexts, out["responses"])
    with torch.no_grad():
        fp32 = policy.analyze_responses(contexts, out["responses"])
        fp32_scores = reward_model.score(contexts, out["responses"])
    assert out["responses"].shape == (2, 6)
    torch.testing.assert_close(out["logprobs"], fp32["logprobs"], atol=0.1, rtol=0.02)
    torch.testing.assert_close(out["values"], fp32["values"], atol=0.05, rtol=0.05)
    torch.testing.assert_close(scores, fp32_scores, atol=0.05, rtol=0.05)


def test_run_options_reach_the_reward_model_run(monkeypatch):
    # --compile, --device, --no-tf32, --micro-batch-sequences: train_policy.py trains its reward model with the same options
    import train_reward
    from lm_human_preference_details.cli.parsing import parse_args

    argv = ["--task", "sentiment", "--compile", "--no-tf32", "--device", "cpu", "--micro-batch-sequences", "16"]
    args = parse_args(train_policy.build_args, "test", argv).finalize(check_inputs=False)
    assert (args.compile, args.tf32, args.device, args.micro_batch_sequences) == (True, False, "cpu", 16)
    assert parse_args(train_reward.build_args, "test", ["--compile"]).compile is True
    assert parse_args(train_policy.build_args, "test", []).compile is False
    seen = {}

    class Stop(Exception):
        pass

    def fake_train(reward_args):
        seen["args"] = reward_args
        raise Stop

    monkeypatch.setattr(train_reward, "train", fake_train)
    with pytest.raises(Stop):
        train_policy.get_reward_model(args, tokenizer=None, device="cpu")
    reward_args = seen["args"]
    options = (reward_args.compile, reward_args.tf32, reward_args.device, reward_args.micro_batch_sequences)
    assert options == (True, False, "cpu", 16)
    assert reward_args.output_dir.endswith("policy_sentiment_seed1/reward")


def test_the_reward_run_gets_every_option_of_the_policy_run():
    # reward_run_args hands on every field of RunArgs and RewardTrainHParams; one that did not reach the reward run
    # would keep its default here (and is caught: every value below differs from its default)
    import dataclasses

    import train_reward
    from lm_human_preference_details.cli.run_args import RunArgs

    args = train_policy.build_args("sentiment")
    new = args.rewards.train_new_model
    changed = {"seed": 7, "num_ranks": 4, "exact_ranks": True, "micro_batch_sequences": 8, "output_dir": "/tmp/p",
               "device": "cpu", "tf32": False, "compile": True, "track": True, "wandb_project": "p",
               "wandb_entity": "e", "exp_name": "x", "resume": True, "overwrite": False, "keep_checkpoints": 3,
               "task_name": "tldr"}
    # world_size: set by Ranks.start; first_phase: set for the reward run (one W&B run holds both phases)
    assert set(changed) == {f.name for f in dataclasses.fields(RunArgs)} - {"world_size", "first_phase"}
    for name, value in changed.items():
        setattr(args, name, value)
    hparams = {"batch_size": 8, "lr": 1e-4, "rollout_batch_size": 64, "normalize_samples": 64, "debug_normalize": 2,
               "normalize_before": False, "normalize_after": False, "eval_labels": 16}
    assert set(hparams) | {"labels"} == {f.name for f in dataclasses.fields(train_reward.RewardTrainHParams)}
    for name, value in hparams.items():
        setattr(new, name, value)
    new.labels = dataclasses.replace(new.labels, num_train=64)
    args.base_model = "/models/m"
    reward_args = train_policy.reward_run_args(args, check_inputs=False)
    assert {n: getattr(reward_args, n) for n in changed} == {**changed, "output_dir": "/tmp/p/reward"}
    assert {n: getattr(reward_args, n) for n in hparams} == hparams
    assert reward_args.labels.num_train == 64 and reward_args.base_model == "/models/m"
    assert reward_args.task == args.task.resolved()
    assert reward_args.first_phase and not args.first_phase
    new.seed = 11  # --rewards.train-new-model.seed, when given, seeds the reward run alone
    assert train_policy.reward_run_args(args, check_inputs=False).seed == 11
    args.resume, args.overwrite = False, True  # the two contradict each other (check_run_options): one at a time
    assert train_policy.reward_run_args(args, check_inputs=False).overwrite
