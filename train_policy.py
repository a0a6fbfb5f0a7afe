"""Fine-tune GPT-2 with PPO against a learned reward model, as OpenAI's lm-human-preferences did.

    python train_policy.py --task sentiment                     # trains the reward model first
    python train_policy.py --task sentiment --rewards.trained-model runs/reward_sentiment_seed1/reward_model
    python train_policy.py --task offline                       # tiny offline task, minutes on a CPU

Each update (OAI lm_human_preferences/train_policy.py: PPOTrainer.step), in train():
  1. rollout: sample batch_size queries; the policy samples exactly response_length tokens each,
     keeping log-probs and values from the sampling pass itself;
  2. reference: log-probs of the same raw responses under the frozen initial model;
  3. score: truncate after the first truncate_token at or after truncate_after, score
     [query, truncated response] with the reward model, -1 for responses with no truncate token;
  4. rewards: -kl_coef * (logprobs - ref_logprobs) per token, plus the score at the last token;
  5. PPO: noptepochs epochs over fresh permutations in nminibatches minibatches; inside the
     loss, whitening and GAE per minibatch (in the original's per-rank groups), clipped value
     and policy losses, TF-1 Adam with the learning rate annealed per update;
  6. adapt kl_coef towards the target KL, log, and save now and then.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# Before torch loads: its CPU allocator then backs large tensors with 2 MiB pages, instead of faulting in a
# fresh 4 KiB page at a time (a [50257, 768] gradient took 0.19 s to zero, 0.05 s with this; README, Speed)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import numpy as np
import torch
import tyro
from tqdm.auto import tqdm

import train_reward
from lm_human_preference_details.checkpoint import (
    BackgroundSaver,
    Stopped,
    StopSignals,
    check_finite,
    check_same_run,
    checkpoint_dir,
    fingerprint,
    list_checkpoints,
    load_checkpoint,
    prepare_run_dir,
    restore,
    training_state,
)
from lm_human_preference_details.cli import RunArgs, UserError, check_at_least, check_positive, pick_device, run_main
from lm_human_preference_details.gpt2 import compile_blocks
from lm_human_preference_details.model import (
    Policy,
    RewardModel,
    check_saved_model,
    load_lm,
    load_model_dir,
    save_model_dir,
)
from lm_human_preference_details.oai_checkpoints import is_tf_checkpoint, resolve_reward_model
from lm_human_preference_details.optim import TF1Adam, set_lr
from lm_human_preference_details.ppo import (
    AdaptiveKLController,
    FixedKLController,
    annealed_lr,
    apply_rejection,
    check_ppo,
    compute_advantages,
    kl_rewards,
    policy_loss,
    responses_pass_filter,
    truncate_responses,
    value_loss,
)
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.ranks import Ranks, rank_seed, setup_distributed, shutdown_distributed
from lm_human_preference_details.tasks import TaskHParams, check_task, check_task_inputs, get_task, parse_args
from lm_human_preference_details.tokenizer import encode_plain, load_tokenizer
from lm_human_preference_details.tracking import Tracker


@dataclass
class NewRewardModel(train_reward.RewardTrainHParams):
    """The reward model a policy run trains first when no --rewards.trained-model is given (OAI train_policy.py:
    rewards.train_new_model, launch.py); its task, base model and run options are the policy run's."""

    seed: Optional[int] = None
    """seed of the reward model's run (default: the policy's --seed, as launch.py passes the same run seed)"""


@dataclass
class RewardHParams:
    """The KL penalty and the reward model (OAI train_policy.py: RewardHParams, AdaptiveKLParams)."""

    kl_coef: float = 0.15
    """initial coefficient of the per-token KL penalty (launch.py: 0.15 books, 0.03 tldr, 0.01 cnndm)"""
    adaptive_kl: bool = True
    """adapt kl_coef towards the target KL (launch.py: on for books, off for tldr/cnndm)"""
    target: float = 6.0
    """target KL in nats per response for the adaptive controller (launch.py: 6.0)"""
    horizon: int = 10000
    """adaptive controller horizon in episodes (train_policy.py AdaptiveKLParams: 10000)"""
    trained_model: Optional[str] = None
    """directory saved by train_reward.py, oai:NAME (OpenAI's released run, e.g. oai:descriptiveness) or an OAI TF
    reward_model directory; without it a reward model is trained first into the run directory"""
    train_new_model: NewRewardModel = field(default_factory=NewRewardModel)
    """labels and hyperparameters of the reward model trained first (preset from --task, as train_reward.py's);
    its labels.source is also where --task.query-dataset oai-label-queries reads the policy's queries"""


@dataclass
class PpoHParams:
    """PPO (OAI train_policy.py: PpoHParams)."""

    total_episodes: int = 1_000_000
    """episodes over the whole run (launch.py: 1e6)"""
    batch_size: int = 512
    """episodes per update, the original's 8 ranks together (launch.py: 512 books, 32 tldr/cnndm)"""
    nminibatches: int = 1
    """minibatches per epoch (train_policy.py: 1)"""
    noptepochs: int = 4
    """epochs over each batch (train_policy.py: 4)"""
    lr: float = 1e-5
    """initial learning rate, annealed linearly to 0 over the run (launch.py: 1e-5 books, 2e-6 tldr/cnndm)"""
    vf_coef: float = 0.1
    """value loss coefficient (train_policy.py: 0.1)"""
    cliprange: float = 0.2
    """policy ratio clip (train_policy.py: 0.2)"""
    cliprange_value: float = 0.2
    """value clip around the rollout values (train_policy.py: 0.2)"""
    gamma: float = 1.0
    """discount (train_policy.py: 1)"""
    lam: float = 0.95
    """GAE lambda (train_policy.py: 0.95)"""
    whiten_rewards: bool = True
    """whiten rewards (without shifting their mean) before GAE (train_policy.py: True; tldr/cnndm: False)"""


@dataclass
class Args(RunArgs):
    task: TaskHParams = field(default_factory=TaskHParams)
    """what a query and a response are (preset from --task)"""
    rewards: RewardHParams = field(default_factory=RewardHParams)
    """KL penalty and reward model (preset from --task)"""
    ppo: PpoHParams = field(default_factory=PpoHParams)
    """PPO hyperparameters (preset from --task)"""
    base_model: str = "gpt2"
    """Hugging Face name or local directory of the initial policy (launch.py: GPT-2 124M)"""
    log_interval: int = 10
    """print and log a table of samples every this many updates (train_reward.py RunHParams: 10)"""
    save_interval: int = 50
    """save the policy and a training checkpoint every this many updates, and at the end (train_reward.py
    RunHParams: 50)"""
    bf16: bool = False
    """bfloat16 autocast for every forward pass (a numerics deviation, README); log-softmax stays fp32"""
    n_updates: tyro.conf.Suppress[int] = 0
    minibatch_size: tyro.conf.Suppress[int] = 0
    rank_minibatch_size: tyro.conf.Suppress[int] = 0

    def finalize(self, check_inputs: bool = True) -> "Args":
        """Derived sizes and every check of the flags, each a one-line fix, before anything loads.

        ``check_inputs`` also reads what the flags name (the base model's files or hub config, the reward model's
        directory); tests of the presets alone leave it off.
        """
        ppo = self.ppo
        check_at_least("--ppo.total-episodes", ppo.total_episodes, 1, "episodes over the whole run")
        check_at_least("--ppo.batch-size", ppo.batch_size, 1, "episodes per update")
        check_at_least("--ppo.nminibatches", ppo.nminibatches, 1, "minibatches per epoch")
        check_at_least("--ppo.noptepochs", ppo.noptepochs, 1, "epochs over each batch")
        check_at_least("--num-ranks", self.num_ranks, 1, "the number of emulated ranks")
        check_at_least("--log-interval", self.log_interval, 1, "updates between sample tables")
        check_at_least("--save-interval", self.save_interval, 1, "updates between saves")
        if self.rewards.adaptive_kl:
            check_positive("--rewards.target", self.rewards.target, "the KL the controller aims at")
            check_at_least("--rewards.horizon", self.rewards.horizon, 1, "the controller's horizon in episodes")
        check_task(self.task)
        check_ppo(ppo, self.rewards)
        # OAI lm_human_preferences/train_policy.py: nupdates = ceil_div(total_episodes, batch_size)
        self.n_updates = math.ceil(ppo.total_episodes / ppo.batch_size)
        if ppo.batch_size % ppo.nminibatches:
            raise UserError(f"ppo.batch_size ({ppo.batch_size}) must be divisible by ppo.nminibatches ({ppo.nminibatches})")
        self.minibatch_size = ppo.batch_size // ppo.nminibatches
        if self.minibatch_size % self.num_ranks:
            raise UserError(f"a minibatch of {self.minibatch_size} episodes does not split into --num-ranks "
                            f"({self.num_ranks}) equal groups; change --num-ranks or --ppo.batch-size")
        self.rank_minibatch_size = self.minibatch_size // self.num_ranks
        # OAI lm_human_preferences/train_policy.py: train, per-rank minibatch >= 8 for whitening
        if ppo.whiten_rewards and self.rank_minibatch_size < 8:
            raise UserError(f"reward whitening groups hold {self.rank_minibatch_size} episodes (batch_size / "
                            f"(nminibatches * num_ranks)); they need >= 8: raise --ppo.batch-size or lower "
                            f"--num-ranks")
        self.task = self.task.resolved()
        self.finalize_run("policy", **{"the minibatch size": self.minibatch_size})
        if check_inputs:
            get_task(self.task_name).prepare()  # a task's local assets, before their files are checked
            check_task_inputs(self.task, self.base_model, self.rewards.train_new_model.labels.source)
            path = self.rewards.trained_model
            if path is None:
                reward_run_args(self, check_inputs)  # the reward run this one starts, checked now, not after loading
            elif not path.startswith("oai:") and not is_tf_checkpoint(path):
                hparams = check_saved_model(path, "reward", "--rewards.trained-model")
                check_reward_task(path, hparams, self.task)
        return self


def build_args(task_name: str) -> Args:
    """The defaults of the `--task` preset."""
    task = get_task(task_name)
    new_model = NewRewardModel(labels=task.labels, **task.train_reward)
    return Args(task=task.task, rewards=RewardHParams(**task.rewards, train_new_model=new_model), ppo=PpoHParams(**task.ppo),
                base_model=task.base_model, task_name=task_name, **task.run)


def reward_run_args(args: Args, check_inputs: bool) -> train_reward.Args:
    """The finalized arguments of the reward run a policy run starts when --rewards.trained-model is not given."""
    # OAI lm_human_preferences/train_policy.py: train, rewards.train_new_model (same task, run directory); its
    # labels and hyperparameters from --rewards.train-new-model.*, every run option (the ranks too) by construction
    new = args.rewards.train_new_model
    run_options = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunArgs)}
    run_options["output_dir"] = str(Path(args.output_dir) / "reward")
    run_options["seed"] = args.seed if new.seed is None else new.seed
    hparams = {f.name: getattr(new, f.name) for f in dataclasses.fields(train_reward.RewardTrainHParams)}
    reward_args = train_reward.Args(**hparams, **run_options, task=args.task, base_model=args.base_model)
    return reward_args.finalize(check_inputs)


def check_reward_task(path: str, hparams: dict, task: TaskHParams) -> None:
    """The reward model was trained on queries and responses of this run's lengths (a TF checkpoint may not say)."""
    trained = hparams.get("task", {})
    for key in ("query_length", "response_length"):
        if trained.get(key, getattr(task, key)) != getattr(task, key):
            raise UserError(f"reward model {path} was trained with {key} {trained.get(key)}, this run uses "
                            f"{getattr(task, key)}; pass a matching --rewards.trained-model or "
                            f"--task.{key.replace('_', '-')}")


def get_reward_model(args: Args, tokenizer, device) -> tuple[RewardModel, dict]:
    """Load --rewards.trained-model, or train one with train_reward.py first (as OAI launch.py does)."""
    path = args.rewards.trained_model
    if path is None:
        path = train_reward.train(reward_run_args(args, check_inputs=False))  # checked by Args.finalize
    path = resolve_reward_model(path)  # oai:NAME or a TF checkpoint of the original: converted once, cached
    reward_model, reward_tokenizer, hparams = load_model_dir(path, "reward", device)
    check_reward_task(path, hparams, args.task)
    if reward_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"reward model {path} was trained with another tokenizer than {args.base_model}'s; "
                        "train it on the same base model")
    return reward_model.requires_grad_(False), hparams


@torch.no_grad()
def rollout(policy: Policy, ref_policy: Policy, reward_model: RewardModel, queries: torch.Tensor, args: Args,
            prefix: list[int], suffix: list[int], ranks: Ranks) -> dict[str, torch.Tensor]:
    """Phases 1-3 of an update on this process's ranks' queries: sample, reference log-probs, score."""
    task = args.task
    contexts = format_queries(queries, prefix, suffix)  # [b, prefix + query_length + suffix]
    # E9: each rank's sampling noise from its own generator, drawn for the whole batch so micro-batches do not change it
    uniforms = ranks.uniforms(len(queries) // len(ranks.held), task.response_length)  # [b, response_length]
    chunks = []
    for mb in ranks.row_slices(len(queries), args.micro_batches):  # each rank's rows alone with --exact-ranks
        # 1. C1/C2: the sampling pass gives responses, their log-probs and values
        sampled = policy.sample(contexts[mb], task.response_length, uniforms=uniforms[mb])
        # 2. C3: reference log-probs of the same raw responses under the frozen initial model
        ref_logprobs = ref_policy.analyze_responses(contexts[mb], sampled["responses"])["logprobs"]
        # 3. E2: truncate, score [query, truncated response], reject responses without a truncate token
        postprocessed = truncate_responses(sampled["responses"], task.truncate_token, task.truncate_after, policy.pad_id)
        scores = reward_model.score(queries[mb], postprocessed)
        scores = apply_rejection(scores, responses_pass_filter(postprocessed, task.truncate_token, task.truncate_after),
                                 task.penalty_reward_value)
        chunks.append({**sampled, "ref_logprobs": ref_logprobs, "postprocessed_responses": postprocessed, "scores": scores})
    data = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
    data["contexts"], data["queries"] = contexts, queries
    return data


def minibatch_indices(ranks: Ranks, args: Args) -> list[torch.Tensor]:
    """One epoch's minibatches of this process's rows: each held rank permutes its own share with its own generator,
    minibatch j joins every held rank's j-th slice."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.train, np.random.permutation per rank per epoch
    per_rank = args.ppo.batch_size // args.num_ranks
    permutations = [torch.from_numpy(p) + i * per_rank for i, p in enumerate(ranks.minibatch_permutations(per_rank))]
    order = torch.stack(permutations)  # [held ranks, per_rank]
    return [order[:, s : s + args.rank_minibatch_size].reshape(-1) for s in range(0, per_rank, args.rank_minibatch_size)]


def ppo_epochs(policy: Policy, optimizer: torch.optim.Optimizer, data: dict[str, torch.Tensor],
               args: Args, ranks: Ranks) -> list[dict[str, float]]:
    """Phase 5: noptepochs epochs of PPO minibatch steps; returns each minibatch's stats, averaged over ranks."""
    ppo = args.ppo

    def rank_var(x: torch.Tensor) -> torch.Tensor:
        """Each of the original's ranks took moments of its own minibatch share; the ranks' stats were averaged."""
        return x.reshape(-1, args.rank_minibatch_size * x.shape[1]).var(dim=1, unbiased=False).mean()

    stats: list[torch.Tensor] = []  # [blocks, stats] per minibatch, kept on the device: a GPU never waits for a log line
    for _ in range(ppo.noptepochs):
        for mb in minibatch_indices(ranks, args):
            # E5: whitening and GAE per minibatch, in groups of the original's per-rank size
            advantages, returns = compute_advantages(
                data["rewards"][mb], data["values"][mb], gamma=ppo.gamma, lam=ppo.lam,
                whiten_group_size=args.rank_minibatch_size, whiten_rewards=ppo.whiten_rewards)
            optimizer.zero_grad(set_to_none=True)
            gradients = ranks.gradient_sum(policy.parameters())
            mb_stats = []
            for block in ranks.blocks(len(mb)):  # each rank's share alone with --exact-ranks, else all of them
                size = block.stop - block.start
                block_stats: dict[str, torch.Tensor] = {}
                for part in args.micro_batches(size):
                    rows = slice(block.start + part.start, block.start + part.stop)  # positions in the minibatch
                    idx = mb[rows]
                    out = policy.analyze_responses(data["contexts"][idx], data["responses"][idx])
                    # E6, E7: clipped value and policy losses; one network, no entropy bonus
                    vf_loss, vf_clipfrac = value_loss(out["values"], data["values"][idx], returns[rows],
                                                      ppo.cliprange_value)
                    pg_loss, pg_clipfrac, approxkl = policy_loss(out["logprobs"], data["logprobs"][idx],
                                                                 advantages[rows], ppo.cliprange)
                    loss = pg_loss + ppo.vf_coef * vf_loss
                    weight = len(idx) / size
                    (loss * weight).backward()  # E10: the loss is a mean over the block's rows
                    for k, v in {
                        "loss/policy": pg_loss, "loss/value": vf_loss, "loss/total": loss,
                        "policy/entropy": out["entropies"].mean(), "policy/approxkl": approxkl,
                        "policy/clipfrac": pg_clipfrac, "val/vpred": out["values"].mean(),
                        "val/error": ((out["values"] - returns[rows]) ** 2).mean(), "val/clipfrac": vf_clipfrac,
                    }.items():
                        block_stats[k] = block_stats.get(k, 0.0) + weight * v.detach().float()
                gradients.add()
                block_returns, block_values = returns[block], data["values"][mb[block]]
                block_stats.update({"returns/mean": block_returns.mean(), "returns/var": rank_var(block_returns),
                                    "val/mean": block_values.mean(), "val/var": rank_var(block_values)})
                mb_stats.append(block_stats)
            gradients.reduce()  # E10: the mean over all ranks' minibatch shares
            optimizer.step()
            stats.append(torch.stack([torch.stack(list(b.values())) for b in mb_stats]))  # [blocks, stats]
    names = list(mb_stats[0])
    values = ranks.mean_over_blocks(torch.stack(stats), dim=1).tolist()  # [minibatches, stats]; one copy per update
    return [dict(zip(names, v)) for v in values]


def update_stats(data: dict[str, torch.Tensor], train_stats: list[dict[str, float]], kl_coef: float, update: int,
                 args: Args, elapsed: float, delta: float, ranks: Ranks) -> dict[str, float]:
    """The original's per-update metrics under its names (FIDELITY F), averaged over processes."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.record_step_stats, then mpi_allreduce_mean
    kl = data["logprobs"] - data["ref_logprobs"]  # [b, response_length]
    per_row = torch.stack([data["scores"], data["non_score_reward"].sum(1), kl.sum(1), (-data["logprobs"]).sum(1)])
    local = torch.stack([per_row[:, block].mean(1) for block in ranks.blocks(per_row.shape[1])])  # [blocks, 4]
    score, mean_non_score_reward, mean_kl, entropy = ranks.mean_over_blocks(local).tolist()
    stats = {
        "ppo/objective/score": score,
        "ppo/objective/score_total": score + mean_non_score_reward,
        "ppo/objective/kl": mean_kl,
        "ppo/objective/kl_coef": kl_coef,
        "ppo/objective/entropy": entropy,
    }
    for k in train_stats[0]:  # PPO stats are means over all minibatches of the update
        stats[f"ppo/ppo/{k}"] = float(np.mean([s[k] for s in train_stats]))
    stats["ppo/ppo/val/var_explained"] = 1 - stats["ppo/ppo/val/error"] / stats["ppo/ppo/returns/var"]
    steps = update + 1
    b, r = args.ppo.batch_size, args.task.response_length
    stats.update({
        "ppo/elapsed/updates": steps, "ppo/elapsed/episodes": steps * b, "ppo/elapsed/steps/serial": steps * r,
        "ppo/elapsed/steps/total": steps * b * r, "ppo/elapsed/fps": int(b * r / max(delta, 1e-9)),
        "ppo/elapsed/time": elapsed,
    })
    return stats


def sample_rows(tokenizer, data: dict[str, torch.Tensor], kl_coef: float, n: int = 3) -> list[list]:
    """A few (query, response, score, kl, total) rows for the console and the logs."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.print_samples
    rows = []
    for i in range(min(n, len(data["queries"]))):
        query = [t for t in data["queries"][i].tolist() if t != tokenizer.pad_token_id]
        response = [t for t in data["postprocessed_responses"][i].tolist() if t != tokenizer.pad_token_id]
        kl = (data["logprobs"][i] - data["ref_logprobs"][i]).sum().item()
        score = data["scores"][i].item()
        rows.append([tokenizer.decode(query), tokenizer.decode(response), round(score, 3), round(kl, 3),
                     round(score - kl_coef * kl, 3)])
    return rows


def main(argv: list[str] | None = None) -> dict:
    try:
        return train(parse_args(build_args, __doc__.split("\n")[0], argv).finalize())
    finally:
        shutdown_distributed()


def train(args: Args) -> dict:
    """Run PPO; returns the policy, the reference policy and the last stats (for tests)."""
    # E9: the emulated ranks this process holds (all of them without torchrun), each seeded seed + r * 100003;
    # the global generators get rank 0's seed in every process, so that every process builds the same models
    seed = rank_seed(args.seed, 0)
    torch.manual_seed(seed)
    np.random.seed(seed)
    device = setup_distributed(pick_device(args.device, args.tf32))
    ranks = Ranks(args.num_ranks, args.seed, device, exact=args.exact_ranks)
    args.world_size = ranks.world_size
    compile_blocks(args.compile)
    # DEVIATION (opt-in): bf16 autocast, --bf16; the original computed in fp32
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)
    run_dir = Path(args.output_dir)
    with ranks.main_first():  # before anything is written: process 0 checks and cleans the run directory
        resume_from = (prepare_run_dir(run_dir, resume=args.resume, overwrite=args.overwrite) if ranks.is_main
                       else (list_checkpoints(run_dir) or [None])[-1] if args.resume else None)
    task = get_task(args.task_name)
    with ranks.main_first():  # process 0 builds any cached assets, the others read them
        task.prepare()
    tokenizer = load_tokenizer(args.base_model)
    pad_id = tokenizer.pad_token_id
    reward_model, reward_hparams = get_reward_model(args, tokenizer, device)
    torch.manual_seed(seed)
    np.random.seed(seed)

    policy = Policy(load_lm(args.base_model), pad_id, args.task.temperature).to(device)
    ref_policy = Policy(load_lm(args.base_model), pad_id, args.task.temperature).to(device)
    ref_policy.requires_grad_(False)
    ranks.broadcast_parameters(policy)  # OAI train_policy.py: sync_models, every rank starts from rank 0's weights
    ranks.broadcast_parameters(ref_policy)
    optimizer = TF1Adam(policy.parameters(), lr=args.ppo.lr, eps=1e-5)  # D5
    kl_ctl = (AdaptiveKLController(args.rewards.kl_coef, args.rewards.target, args.rewards.horizon)
              if args.rewards.adaptive_kl else FixedKLController(args.rewards.kl_coef))  # E4
    # E9: rank r's block of every batch (its whitening group) comes from rank r's own query stream
    sampler = make_query_sampler(tokenizer, args.task, batch_size=args.ppo.batch_size, seed=args.seed,
                                 num_ranks=args.num_ranks, ranks=ranks.held,
                                 labels_source=args.rewards.train_new_model.labels.source)
    prefix, suffix = encode_plain(tokenizer, [args.task.query_prefix, args.task.query_suffix])
    config = dataclasses.asdict(args)
    # everything the next update depends on; a resumed run loads it into the objects just built (checkpoint.py)
    objects = {"policy": policy, "optimizer": optimizer, "kl_ctl": kl_ctl, "sampler": sampler, "ranks": ranks}
    run_identity = {**config, "reward_model_fingerprint": fingerprint(reward_model)}
    checkpoint = load_checkpoint(resume_from) if resume_from else {"update": 0, "elapsed": 0.0, "tracker": {}}
    if resume_from:
        check_same_run(checkpoint["config"], run_identity)
    tracker = Tracker(run_dir, config, track=args.track, project=args.wandb_project, entity=args.wandb_entity,
                      name=f"policy_{args.task_name}_seed{args.seed}_{int(time.time())}",
                      resume_step=checkpoint["update"] if args.resume else None,
                      wandb_id=checkpoint["tracker"].get("wandb_id"), enabled=ranks.is_main)
    if ranks.is_main:
        print(f"train_policy: {args.n_updates} updates of {args.ppo.batch_size} episodes, {args.ppo.nminibatches} "
              f"minibatch(es) of {args.minibatch_size}, whitening groups of {args.rank_minibatch_size} "
              f"({args.num_ranks} ranks on {ranks.world_size} process(es)), micro-batch {args.micro_batch_size or 'off'}, "
              f"device {device}, run dir {run_dir}")

    first_update = restore(checkpoint, objects) if resume_from else 0
    start = time.time() - checkpoint["elapsed"]
    last = time.time()

    saver = BackgroundSaver(run_dir, args.keep_checkpoints, models={"policy": policy})

    def save(done: int) -> Path:
        """A thread copies the state to CPU memory during the next rollout, then writes the training checkpoint and
        the Hugging Face policy directory with its update index (process 0)."""
        # every process takes part: the ranks' generator states are gathered from all of them
        state = training_state(done, objects, config=run_identity, tracker=tracker.state_dict(), elapsed=time.time() - start)
        if not ranks.is_main:
            return checkpoint_dir(run_dir, done)
        tracker.flush()  # every row logged before this checkpoint is on disk before it is
        return saver.save(done, state, lambda copies: save_model_dir(run_dir / "policy", copies["policy"], tokenizer,
                                                                     {**config, "update": done}))

    stats: dict[str, float] = {}
    stop = StopSignals()  # SIGTERM / SIGINT: finish the update, save, exit with one line
    progress = tqdm(range(first_update, args.n_updates), desc="ppo", dynamic_ncols=True, initial=first_update,
                    total=args.n_updates, disable=not ranks.is_main)
    for update in saver.watch(stop.watch(progress)):  # saver.watch: the last write completes before the end
        lr = annealed_lr(args.ppo.lr, update, args.n_updates)  # E8: constant within an update
        set_lr(optimizer, lr)
        queries = next(sampler).to(device)  # [batch_size / world_size, query_length]: the held ranks' blocks
        # 1-3. rollout, reference log-probs, scores
        with autocast:
            data = rollout(policy, ref_policy, reward_model, queries, args, prefix, suffix, ranks)
        # 4. E3: per-token KL penalty, the score at the last token
        kl_coef = kl_ctl.value
        data["rewards"], data["non_score_reward"], _ = kl_rewards(data["scores"], data["logprobs"], data["ref_logprobs"],
                                                                  kl_coef)
        # 5. PPO epochs (they change the weights: a checkpoint saved after the last update must be copied first)
        saver.wait_copied()
        with autocast:
            train_stats = ppo_epochs(policy, optimizer, data, args, ranks)
        check_finite(f"update {update}", scores=data["scores"], kl=data["logprobs"] - data["ref_logprobs"],
                     rewards=data["rewards"], loss=[s["loss/total"] for s in train_stats], gradients=policy)
        # 6. log, adapt kl_coef (E4, after the update, from the logged batch KL), save
        now = time.time()
        stats = update_stats(data, train_stats, kl_coef, update, args, now - start, now - last, ranks)
        stats["ppo/ppo/lr"] = lr
        # the task's own metrics, per block (each rank's rows with --exact-ranks), averaged over all of them
        extras = [task.extra_stats(tokenizer, {k: v[block] for k, v in data.items()}) for block in ranks.blocks(len(queries))]
        extra = torch.tensor([list(e.values()) for e in extras], dtype=torch.float64)  # [blocks, metrics]
        stats.update(zip(extras[0], ranks.mean_over_blocks(extra).tolist()))
        last = now
        tracker.log(stats, step=update)
        kl_ctl.update(stats["ppo/objective/kl"], args.ppo.batch_size)
        progress.set_postfix(score=f"{stats['ppo/objective/score']:.3f}", kl=f"{stats['ppo/objective/kl']:.2f}",
                             kl_coef=f"{kl_coef:.4f}")
        if update % args.log_interval == 0 and ranks.is_main:
            rows = sample_rows(tokenizer, data, args.rewards.kl_coef)  # the original prints with the initial kl_coef
            tracker.log_table("samples", ["query", "response", "score", "kl", "total"], rows, step=update)
            for q, r, s, k, t in rows:
                tqdm.write(f"{q!r}\n  -> {r!r}\n  score = {s:+.2f}  kl = {k:+.2f}  total = {t:+.2f}")
        # every process stops at the same update: a signal reaching one of them stops all (the save is collective)
        stopping = ranks.sum(torch.tensor([float(stop.signum is not None)])).item() > 0
        if (update + 1) % args.save_interval == 0 or update + 1 == args.n_updates or stopping:
            saved = save(update + 1)
        saver.check()  # a write that failed ends the run now, not 50 updates later
        if stopping:
            saver.wait()
            tracker.close()
            raise Stopped(f"stopped by {stop.name} after update {update}; saved {saved}; continue with --resume",
                          stop.signum)

    tracker.close()
    if ranks.is_main:
        print(f"saved policy to {run_dir / 'policy'}")
        task.report(args, tokenizer, policy, ref_policy, reward_model, reward_hparams.get("results", {}))
    return {"policy": policy, "ref_policy": ref_policy, "reward_model": reward_model, "stats": stats}


if __name__ == "__main__":
    run_main(main)
