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

import contextlib
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# Before torch loads: large CPU tensors get 2 MiB pages, not 4 KiB ones faulted in one at a time (docs/speed.md)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import numpy as np
import torch
import tyro

import train_reward
from lm_human_preference_details.cli.parsing import run_script
from lm_human_preference_details.cli.run_args import RunArgs
from lm_human_preference_details.language.gpt2 import compile_blocks
from lm_human_preference_details.language.model import (
    Policy,
    RewardModel,
    check_saved_model,
    load_lm,
    load_model_dir,
)
from lm_human_preference_details.language.tf_checkpoint import is_tf_checkpoint
from lm_human_preference_details.language.tokenizer import encode_plain, load_tokenizer
from lm_human_preference_details.language.trained_models import resolve_reward_model
from lm_human_preference_details.online.collection import OnlineCollection, check_shared_labels
from lm_human_preference_details.online.label_file import OnlineLabelFile
from lm_human_preference_details.online.labellers import make_labeller
from lm_human_preference_details.online.schedule import OnlineHParams, Schedule
from lm_human_preference_details.optim import TF1Adam, annealed_lr, set_lr
from lm_human_preference_details.ppo import (
    AdaptiveKLController,
    FixedKLController,
    apply_rejection,
    compute_advantages,
    kl_rewards,
    policy_loss,
    responses_pass_filter,
    truncate_responses,
    value_loss,
)
from lm_human_preference_details.queries import format_queries, make_query_sampler, print_first_query
from lm_human_preference_details.ranks.emulated import Ranks, seed_globals
from lm_human_preference_details.run.checkpoint import check_finite
from lm_human_preference_details.run.identity import fingerprint
from lm_human_preference_details.run.lifecycle import Run
from lm_human_preference_details.tasks import TaskHParams, get_task
from lm_human_preference_details.utils.checks import check_at_least, check_in_range, check_positive, expand_home
from lm_human_preference_details.utils.errors import UserError, run_main


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
    """directory saved by train_reward.py, oai:NAME (OpenAI's released run, e.g. oai:descriptiveness) or OAI TF reward_model;
    without it a reward model is trained first into the run directory"""
    train_new_model: NewRewardModel = field(default_factory=NewRewardModel)
    """labels and hyperparameters of the reward model trained first (preset from --task, as train_reward.py's);
    its labels.source is also where --task.query-dataset oai-label-queries reads the policy's queries"""

    def check(self) -> None:
        """The KL penalty's numbers, and the learning rate of the reward model a run without --rewards.trained-model
        trains first; each failure one line naming the flag."""
        check_at_least("--rewards.kl-coef", self.kl_coef, 0, "the KL penalty's weight")
        if not math.isfinite(self.kl_coef):
            raise UserError(f"--rewards.kl-coef is {self.kl_coef}; pass a finite --rewards.kl-coef")
        if self.adaptive_kl:
            check_positive("--rewards.target", self.target, "the KL the controller aims at")
            check_at_least("--rewards.horizon", self.horizon, 1, "the controller's horizon in episodes")
        if self.trained_model is None:  # the reward model this run trains first
            check_positive("--rewards.train-new-model.lr", self.train_new_model.lr, "the reward model's learning rate")


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

    def check(self) -> None:
        """The sizes and the numbers the PPO maths can train with, each a one-line UserError naming the flag."""
        check_at_least("--ppo.total-episodes", self.total_episodes, 1, "episodes over the whole run")
        check_at_least("--ppo.batch-size", self.batch_size, 1, "episodes per update")
        check_at_least("--ppo.nminibatches", self.nminibatches, 1, "minibatches per epoch")
        check_at_least("--ppo.noptepochs", self.noptepochs, 1, "epochs over each batch")
        check_positive("--ppo.lr", self.lr, "the initial learning rate")
        check_in_range("--ppo.gamma", self.gamma, 0, 1, "the discount", low_open=True)
        check_in_range("--ppo.lam", self.lam, 0, 1, "GAE's lambda")
        check_positive("--ppo.cliprange", self.cliprange, "the clip range of the policy ratio")
        check_positive("--ppo.cliprange-value", self.cliprange_value, "the clip range of the values")
        check_at_least("--ppo.vf-coef", self.vf_coef, 0, "the value loss's weight")
        if not math.isfinite(self.vf_coef):
            raise UserError(f"--ppo.vf-coef is {self.vf_coef}; pass a finite --ppo.vf-coef")


@dataclass
class Args(RunArgs):
    task: TaskHParams = field(default_factory=TaskHParams)
    """what a query and a response are (preset from --task)"""
    rewards: RewardHParams = field(default_factory=RewardHParams)
    """KL penalty and reward model (preset from --task)"""
    ppo: PpoHParams = field(default_factory=PpoHParams)
    """PPO hyperparameters (preset from --task)"""
    online: OnlineHParams = field(default_factory=OnlineHParams)
    """online data collection (Ziegler et al. 2019, section 2.2; docs/online.md): off unless --online.num-labels"""
    base_model: str = "gpt2"
    """Hugging Face name or local directory of the initial policy (launch.py: GPT-2 124M)"""
    sample_print_interval: int = 10
    """print (and log) a table of sampled responses every this many updates (the original's RunHParams.log_interval: 10);
    metrics are logged every update"""
    save_interval: int = 50
    """save the policy and a training checkpoint every this many updates, and at the end (train_reward.py RunHParams: 50)"""
    bf16: bool = False
    """bfloat16 autocast for the transformer's forward passes (a numerics deviation, README "Differences");
    the LM head's logits, their log-softmax and the sampled token's log-prob stay fp32 (lm_head.full_precision)"""
    n_updates: tyro.conf.Suppress[int] = 0
    minibatch_size: tyro.conf.Suppress[int] = 0
    rank_minibatch_size: tyro.conf.Suppress[int] = 0

    def finalize(self, check_inputs: bool = True) -> "Args":
        """Derived sizes and every check of the flags, each a one-line fix, before anything loads.

        ``check_inputs`` also reads what the flags name (the base model's files or hub config, the reward model's
        directory); tests of the presets alone leave it off.
        """
        self.check_run_options()
        ppo = self.ppo
        ppo.check()
        self.rewards.check()
        self.online.check(self.rewards.train_new_model.labels.num_train, get_task(self.task_name))
        if self.online.enabled and self.rewards.trained_model is not None:
            raise UserError("--online.num-labels trains its own reward models from the labels it collects; drop "
                            "--rewards.trained-model")
        check_at_least("--sample-print-interval", self.sample_print_interval, 1, "updates between sample tables")
        check_at_least("--save-interval", self.save_interval, 1, "updates between saves")
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
        new = self.rewards.train_new_model
        new.labels = new.labels.resolved()
        self.rewards.trained_model = expand_home(self.rewards.trained_model)
        self.finalize_run("policy", check_inputs, new.labels.source, **{"the minibatch size": self.minibatch_size})
        if check_inputs:
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
                online=OnlineHParams(**task.online), base_model=task.base_model, task_name=task_name, **task.run)


def reward_run_args(args: Args, check_inputs: bool, **changes) -> train_reward.Args:
    """The finalized arguments of the reward run a policy run starts when --rewards.trained-model is not given
    (``changes``: an online training's labels, seed and directory)."""
    # OAI lm_human_preferences/train_policy.py: train, rewards.train_new_model (same task, run directory): its labels
    # and hyperparameters from --rewards.train-new-model.*, this run's task, base model and run options (the ranks too)
    new = args.rewards.train_new_model
    hparams = {f.name: getattr(new, f.name) for f in dataclasses.fields(train_reward.RewardTrainHParams)}
    run_options = {f.name: getattr(args, f.name) for f in dataclasses.fields(RunArgs) if f.name != "world_size"}
    # first_phase: one W&B run holds the reward model's batches, then PPO's updates (as the baseline's)
    run_options.update(seed=args.seed if new.seed is None else new.seed, output_dir=str(Path(args.output_dir) / "reward"),
                       first_phase=True)
    # world_size: set by the reward run's own Ranks.start
    reward_args = train_reward.Args(**{**hparams, **run_options, **changes}, task=args.task, base_model=args.base_model)
    return reward_args.finalize(check_inputs)


def initial_policies(args: Args, pad_id: int, ranks: Ranks) -> tuple[Policy, Policy]:
    """The policy to train and the frozen reference policy, both the initial model, with rank 0's weights."""
    policy = Policy(load_lm(args.base_model), pad_id, args.task.temperature).to(ranks.device)
    ref_policy = Policy(load_lm(args.base_model), pad_id, args.task.temperature).to(ranks.device)
    ref_policy.requires_grad_(False)
    ranks.broadcast_parameters(policy)  # OAI train_policy.py: sync_models, every rank starts from rank 0's weights
    ranks.broadcast_parameters(ref_policy)
    return policy, ref_policy


def check_reward_task(path: str, hparams: dict, task: TaskHParams) -> None:
    """The reward model was trained on queries and responses of this run's lengths (a TF checkpoint may not say)."""
    trained = hparams.get("task", {})
    for key in ("query_length", "response_length"):
        if trained.get(key, getattr(task, key)) != getattr(task, key):
            raise UserError(f"reward model {path} was trained with {key} {trained.get(key)}, this run uses "
                            f"{getattr(task, key)}; pass a matching --rewards.trained-model or "
                            f"--task.{key.replace('_', '-')}")


def get_reward_model(args: Args, tokenizer, device, ranks: Ranks | None = None) -> tuple[RewardModel, dict]:
    """Load --rewards.trained-model, or train one with train_reward.py first (as OAI launch.py does)."""
    path = args.rewards.trained_model
    if path is None:
        path = train_reward.train(reward_run_args(args, check_inputs=False))  # checked by Args.finalize
    # every process: one converts under the cache entry's lock while the others wait for it, polling, not in a collective
    with ranks.agree() if ranks is not None else contextlib.nullcontext():
        path = resolve_reward_model(path)  # oai:NAME or a TF checkpoint of the original: converted once, cached
    reward_model, reward_tokenizer, hparams = load_model_dir(path, "reward", device)
    check_reward_task(path, hparams, args.task)
    if reward_tokenizer.get_vocab() != tokenizer.get_vocab():
        raise UserError(f"reward model {path} was trained with another tokenizer than {args.base_model}'s; "
                        "train it on the same base model")
    return reward_model.requires_grad_(False), hparams


def online_training_dir(online_dir: Path, k: int) -> Path:
    """RUN/online/reward_KK, where online training k runs (its train_reward.py --output-dir, which the user never
    passed): a file there is one line naming that path."""
    out = online_dir / f"reward_{k:02d}"
    if os.path.lexists(out) and not out.is_dir():
        raise UserError(f"{out} is not a directory; the run trains its online reward model {k} there: move it away, "
                        "then --resume the run")
    return out


def start_online(args: Args, tokenizer, device, run: Run) -> OnlineCollection | None:
    """Online data collection (Ziegler et al. 2019, section 2.2) when --online.num-labels is set, else None."""
    if not args.online.enabled:
        return None
    new = args.rewards.train_new_model
    schedule = Schedule(new.labels.num_train, args.online.num_labels, args.ppo.total_episodes, args.online.margin,
                        args.online.retrainings)
    label_file = OnlineLabelFile(Path(args.output_dir) / "online" / "labels.json", owner=run.is_main)
    # the requests' queries: the task's stream, shuffled apart from PPO's (seed + 1, shuffle 1)
    sampler = make_query_sampler(tokenizer, args.task, batch_size=args.ppo.batch_size, seed=args.seed + 1, num_ranks=1,
                                 shuffle_seed=1, labels_source=new.labels.source)
    prefix, suffix = encode_plain(tokenizer, [args.task.query_prefix, args.task.query_suffix])

    def train(k: int, num_train: int) -> tuple[RewardModel, dict]:
        """Training k: train_reward.py on the label file's first num_train labels, from the initial language model with
        a new random head (seed + k), normalised as the offline reward model is, into RUN/online/reward_k."""
        check_shared_labels(run.ranks, label_file)  # every process reads the records process 0 wrote
        labels = dataclasses.replace(new.labels, source=str(label_file.path), num_train=num_train)
        seed = (args.seed if new.seed is None else new.seed) + k
        out = online_training_dir(label_file.path.parent, k)
        # a training inside PPO: its curves in its own directory, not in W&B, where the policy's run is open
        path = train_reward.train(reward_run_args(args, False, labels=labels, seed=seed, first_phase=False, track=False,
                                                  output_dir=str(out)))
        reward_model, _, hparams = load_model_dir(path, "reward", device)
        rows = [json.loads(line) for line in (path.parent / "metrics.jsonl").read_text().splitlines()]
        loss = [r["train_reward/minibatch/loss"] for r in rows if "train_reward/minibatch/loss" in r][-1]
        return reward_model.requires_grad_(False), {**hparams, "last_loss": loss}  # its last batch's loss

    # under torchrun process 0 alone talks to the labeller (starts the program, serves the page); every process trains
    labeller = make_labeller(args.online, tokenizer, get_task(args.task_name), args.task, label_file.path.parent) \
        if run.is_main else None
    # say: the lines PPO prints while it waits for labels, above the progress bar; stop_received: asked inside an update
    # only, a stop ends a wait for labels
    return OnlineCollection(schedule, label_file, labeller, sampler, args.task, prefix, suffix, tokenizer.pad_token_id,
                            args.seed, (args.ppo.batch_size, new.batch_size), train, ranks=run.ranks, say=run.print,
                            stop_received=lambda: run.stop.signum)


@torch.no_grad()
def rollout(policy: Policy, ref_policy: Policy, reward_model: RewardModel, queries: torch.Tensor, args: Args,
            prefix: list[int], suffix: list[int], ranks: Ranks, kl_coef: float) -> dict[str, torch.Tensor]:
    """Phases 1-4 of an update on this process's ranks' queries: sample, reference log-probs, score, rewards;
    -> everything the PPO epochs and the logs read, not changed afterwards."""
    task = args.task
    contexts = format_queries(queries, prefix, suffix)  # [b, prefix + query_length + suffix]
    # E9 per-rank seeds: each rank's sampling noise from its own generator, drawn for the whole batch (micro-batches
    # do not change it)
    uniforms = ranks.draws.uniforms(len(queries) // len(ranks.held), task.response_length)  # [b, response_length]
    chunks = []
    for mb in ranks.row_slices(len(queries), args.micro_batches):  # each rank's rows alone with --exact-ranks
        # 1. C1 plain sampling, C2 rollout log-probs and values: the sampling pass gives responses, their log-probs and values
        sampled = policy.sample(contexts[mb], task.response_length, uniforms=uniforms[mb])
        # 2. C3 scoring slice: reference log-probs of the same raw responses under the frozen initial model
        ref_logprobs = ref_policy.analyze_responses(contexts[mb], sampled["responses"])["logprobs"]
        # 3. E2 truncate and score: truncate, score [query, truncated response], reject responses without a truncate token
        postprocessed = truncate_responses(sampled["responses"], task.truncate_token, task.truncate_after, policy.pad_id)
        scores = reward_model.score(queries[mb], postprocessed)
        scores = apply_rejection(scores, responses_pass_filter(postprocessed, task.truncate_token, task.truncate_after),
                                 task.penalty_reward_value)
        chunks.append({**sampled, "ref_logprobs": ref_logprobs, "postprocessed_responses": postprocessed, "scores": scores})
    data = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
    # 4. E3 KL penalty: -kl_coef * kl per token, plus the score at the last token
    data["rewards"], data["non_score_reward"], data["kl"] = kl_rewards(data["scores"], data["logprobs"],
                                                                       data["ref_logprobs"], kl_coef)
    return {**data, "contexts": contexts, "queries": queries}


def minibatch_indices(ranks: Ranks, args: Args) -> list[torch.Tensor]:
    """One epoch's minibatches of this process's rows: each held rank permutes its own share with its own generator,
    minibatch j joins every held rank's j-th slice."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.train, np.random.permutation per rank per epoch
    per_rank = args.ppo.batch_size // args.num_ranks
    shares = ranks.draws.minibatch_permutations(per_rank)  # each held rank's own order of its share
    permutations = [torch.from_numpy(p) + i * per_rank for i, p in enumerate(shares)]
    order = torch.stack(permutations).to(ranks.device)  # [held ranks, per_rank], where the rollout's tensors are
    return [order[:, s : s + args.rank_minibatch_size].reshape(-1) for s in range(0, per_rank, args.rank_minibatch_size)]


def ppo_loss(policy: Policy, data: dict[str, torch.Tensor], idx: torch.Tensor, advantages: torch.Tensor,
             returns: torch.Tensor, ppo: PpoHParams) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The PPO loss of rows ``idx`` of the rollout, with their advantages and returns -> (loss, statistics)."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.loss
    out = policy.analyze_responses(data["contexts"][idx], data["responses"][idx])
    # E6 value loss, E7 policy loss: clipped, one network, no entropy bonus
    vf_loss, vf_clipfrac = value_loss(out["values"], data["values"][idx], returns, ppo.cliprange_value)
    pg_loss, pg_clipfrac, approxkl = policy_loss(out["logprobs"], data["logprobs"][idx], advantages, ppo.cliprange)
    loss = pg_loss + ppo.vf_coef * vf_loss
    return loss, {"loss/policy": pg_loss, "loss/value": vf_loss, "loss/total": loss,
                  "policy/entropy": out["entropies"].mean(), "policy/approxkl": approxkl, "policy/clipfrac": pg_clipfrac,
                  "val/vpred": out["values"].mean(), "val/error": ((out["values"] - returns) ** 2).mean(),
                  "val/clipfrac": vf_clipfrac}


def autocast(args: Args, device: torch.device) -> torch.autocast:
    """--bf16: bfloat16 autocast for the forward passes inside it (off: nothing).

    Autocast keeps its bf16 copies of the weights until its outermost context exits, so a context must never span an
    optimizer step: the forward passes after the step would run on the old weights' copies.
    """
    # DEVIATION (opt-in): bf16 autocast, --bf16; the original computed in fp32
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16)


def ppo_epochs(policy: Policy, optimizer: torch.optim.Optimizer, data: dict[str, torch.Tensor],
               args: Args, ranks: Ranks) -> list[dict[str, float]]:
    """Phase 5: noptepochs epochs over fresh permutations, one optimizer step per minibatch; -> each minibatch's
    statistics, averaged over ranks."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.train
    ppo = args.ppo
    stats = []  # per minibatch: name -> [blocks], kept on the device (a GPU never waits for a log line)
    for _ in range(ppo.noptepochs):
        for mb in minibatch_indices(ranks, args):
            # E5 whitening and GAE: per minibatch, in groups of the original's per-rank size
            advantages, returns = compute_advantages(data["rewards"][mb], data["values"][mb], gamma=ppo.gamma,
                                                     lam=ppo.lam, whiten_group_size=args.rank_minibatch_size,
                                                     whiten_rewards=ppo.whiten_rewards)
            optimizer.zero_grad(set_to_none=True)

            def loss_fn(rows: slice) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # rows: positions in mb
                with autocast(args, ranks.device):  # a context per forward pass: the weights change at every step
                    return ppo_loss(policy, data, mb[rows], advantages[rows], returns[rows], ppo)

            # E10 gradient averaging: loss.backward() micro-batch by micro-batch, the gradient averaged over every rank
            stats.append({**ranks.backward(loss_fn, len(mb), policy.parameters(), args.micro_batches),
                          **rank_moments(returns, data["values"][mb], ranks, args.rank_minibatch_size)})
            optimizer.step()
    names = list(stats[0])
    values = torch.stack([torch.stack([s[k] for k in names]) for s in stats])  # [minibatches, stats, blocks]
    return [dict(zip(names, v)) for v in ranks.mean_over_blocks(values, dim=2).tolist()]  # one copy per update


def rank_moments(returns: torch.Tensor, values: torch.Tensor, ranks: Ranks, group: int) -> dict[str, torch.Tensor]:
    """Mean and variance of a minibatch's returns and rollout values as each of the original's ranks took them over
    its own share (``group`` rows), per block: name -> [blocks]."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.loss, returns/val moments, then mpi_allreduce_mean
    def var(x: torch.Tensor) -> torch.Tensor:  # [rows, response_length] -> the mean of each rank's population var
        return x.reshape(-1, group * x.shape[1]).var(dim=1, unbiased=False).mean()

    moments: dict[str, list[torch.Tensor]] = {"returns/mean": [], "returns/var": [], "val/mean": [], "val/var": []}
    for block in ranks.blocks(len(returns)):
        for name, x in (("returns", returns[block]), ("val", values[block])):
            moments[f"{name}/mean"].append(x.mean().double())
            moments[f"{name}/var"].append(var(x).double())
    return {k: torch.stack(v) for k, v in moments.items()}


def update_stats(data: dict[str, torch.Tensor], train_stats: list[dict[str, float]], kl_coef: float, update: int,
                 args: Args, elapsed: float, delta: float, ranks: Ranks, task=None, tokenizer=None) -> dict[str, float]:
    """The original's per-update metrics under its names (FIDELITY F), averaged over processes."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.record_step_stats, then mpi_allreduce_mean
    per_row = torch.stack([data["scores"], data["non_score_reward"].sum(1), data["kl"].sum(1), (-data["logprobs"]).sum(1)])
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
    if task is not None:  # the task's own metrics, per block (each rank's rows when exact), averaged over all of them
        blocks = ranks.blocks(len(data["scores"]))
        extras = [task.extra_stats(tokenizer, {k: v[block] for k, v in data.items()}) for block in blocks]
        extra = torch.tensor([list(e.values()) for e in extras], dtype=torch.float64)  # [blocks, metrics]
        stats.update(zip(extras[0], ranks.mean_over_blocks(extra).tolist()))
    return stats


def sample_rows(tokenizer, data: dict[str, torch.Tensor], kl_coef: float, n: int = 3) -> list[list]:
    """A few (query, response, score, kl, total) rows for the console and the logs."""
    # OAI lm_human_preferences/train_policy.py: PPOTrainer.print_samples
    rows = []
    for i in range(min(n, len(data["queries"]))):
        query = [t for t in data["queries"][i].tolist() if t != tokenizer.pad_token_id]
        response = [t for t in data["postprocessed_responses"][i].tolist() if t != tokenizer.pad_token_id]
        kl = data["kl"][i].sum().item()
        score = data["scores"][i].item()
        rows.append([tokenizer.decode(query), tokenizer.decode(response), round(score, 3), round(kl, 3),
                     round(score - kl_coef * kl, 3)])
    return rows


def show_samples(run: Run, tokenizer, data: dict[str, torch.Tensor], args: Args, update: int) -> None:
    """Process 0 logs a table of a few samples and prints them, as the original does every sample_print_interval."""
    if run.is_main:
        rows = sample_rows(tokenizer, data, args.rewards.kl_coef)  # the original prints with the initial kl_coef
        run.log_table("samples", ["query", "response", "score", "kl", "total"], rows, step=update)
        for q, r, s, k, t in rows:
            run.print(f"{q!r}\n  -> {r!r}\n  score = {s:+.2f}  kl = {k:+.2f}  total = {t:+.2f}")


def main(argv: list[str] | None = None) -> dict:
    return run_script(build_args, train, __doc__, argv)


def kl_controller(rewards) -> AdaptiveKLController | FixedKLController:
    """The KL coefficient's controller: adaptive towards rewards.target, or fixed (FIDELITY E4 KL controller)."""
    # OAI lm_human_preferences/train_policy.py: AdaptiveKLController, FixedKLController
    if rewards.adaptive_kl:
        return AdaptiveKLController(rewards.kl_coef, rewards.target, rewards.horizon)
    return FixedKLController(rewards.kl_coef)


def plan_line(args: Args, ranks: Ranks, run_dir: Path) -> str:
    """The run's sizes, ranks, device and directory, in one line printed before the first update."""
    return (f"train_policy: {args.n_updates} updates of {args.ppo.batch_size} episodes, {args.ppo.nminibatches} "
            f"minibatch(es) of {args.minibatch_size}, whitening groups of {args.rank_minibatch_size} "
            f"({args.num_ranks} ranks on {ranks.world_size} process(es)), micro-batch "
            f"{args.micro_batch_sequences or 'off'}, device {ranks.device}, run dir {run_dir}")


def query_sampler(args: Args, tokenizer, ranks: Ranks):
    """The query batches of the ranks this process holds (E9 per-rank seeds: rank r's block of every batch, its
    whitening group, comes from rank r's own query stream)."""
    return make_query_sampler(tokenizer, args.task, batch_size=args.ppo.batch_size, seed=args.seed,
                              num_ranks=args.num_ranks, ranks=ranks.held,
                              labels_source=args.rewards.train_new_model.labels.source)


def train(args: Args) -> dict:
    """Run PPO; returns the policy, the reference policy and the last stats (for tests)."""
    # E9 per-rank seeds: the emulated ranks this process holds (all of them without torchrun)
    ranks = Ranks.start(args, get_task(args.task_name).gpu_sized)
    device = ranks.device
    compile_blocks(args.compile)
    inputs = [args.base_model, args.rewards.trained_model, args.task.query_dataset, args.rewards.train_new_model.labels.source]
    with Run(args, "policy", inputs=inputs, ranks=ranks) as run:
        run.check_options(dataclasses.asdict(args))  # --resume: the options, before a reward model trains or online/
        task = get_task(args.task_name)
        with ranks.agree():  # built once per cache under its lock (files.cache_lock); a failure ends every process
            task.prepare()
        tokenizer = load_tokenizer(args.base_model)
        online = start_online(args, tokenizer, device, run)  # trains the reward models as it collects labels
        reward_model, reward_hparams = (None, {}) if online else get_reward_model(args, tokenizer, device, ranks)
        seed_globals(args.seed)  # the reward run drew from them: the policy's models start from the same state

        policy, ref_policy = initial_policies(args, tokenizer.pad_token_id, ranks)
        optimizer = TF1Adam(policy.parameters(), lr=args.ppo.lr, eps=1e-5)  # D5 TF-1 Adam
        kl_ctl = kl_controller(args.rewards)  # E4 KL controller
        sampler = query_sampler(args, tokenizer, ranks)
        prefix, suffix = encode_plain(tokenizer, [args.task.query_prefix, args.task.query_suffix])
        config = dataclasses.asdict(args)
        # everything the next update depends on: a checkpoint saves it, --resume loads it into these objects
        objects = {"policy": policy, "optimizer": optimizer, "kl_ctl": kl_ctl, "sampler": sampler, "ranks": ranks.draws,
                   **({"online": online} if online else {})}
        # what a resume must find unchanged: the options, and the reward model unless online collection trains its own
        identity = {**config, "reward_model_fingerprint": online is None and fingerprint(reward_model)}
        first_update = run.start(config, objects, identity=identity, models={"policy": policy}, tokenizer=tokenizer)
        print_first_query(sampler, run.print)  # the fork's `=========== <text>`: compare with a baseline run's log
        run.print(plan_line(args, ranks, run.dir))

        stats: dict[str, float] = {}
        last = time.time()
        show = {"score": "ppo/objective/score", "kl": "ppo/objective/kl", "kl_coef": "ppo/objective/kl_coef"}
        for update in run.updates(first_update, args.n_updates, "ppo", show=show):
            lr = annealed_lr(args.ppo.lr, update, args.n_updates)  # E8 lr decay: constant within an update
            set_lr(optimizer, lr)
            if online:  # paper, section 2.2: the requests, labels and reward model trainings due before these episodes
                reward_model, reward_hparams = online.before_episode(update, policy, (reward_model, reward_hparams))
            queries = next(sampler).to(device)  # [batch_size / world_size, query_length]: the held ranks' blocks
            # 1-4. rollout, reference log-probs, scores, rewards with the KL penalty
            kl_coef = kl_ctl.value
            with autocast(args, device):
                data = rollout(policy, ref_policy, reward_model, queries, args, prefix, suffix, ranks, kl_coef)
            train_stats = ppo_epochs(policy, optimizer, data, args, ranks)  # 5. PPO epochs (autocast in each pass)
            check_finite(f"update {update}", scores=data["scores"], kl=data["kl"],
                         rewards=data["rewards"], loss=[s["loss/total"] for s in train_stats], gradients=policy)
            # 6. log, adapt kl_coef (E4 KL controller, after the update, from the logged batch KL), save
            now = time.time()
            stats = update_stats(data, train_stats, kl_coef, update, args, run.elapsed, now - last, ranks, task, tokenizer)
            stats.update({"ppo/ppo/lr": lr, **(online.stats if online else {})})
            last = now
            run.log(stats, step=update)
            kl_ctl.update(stats["ppo/objective/kl"], args.ppo.batch_size)
            if update % args.sample_print_interval == 0:
                show_samples(run, tokenizer, data, args, update)
            stopping = run.stop_requested(update)  # every process learns whether a stop signal reached any
            if run.checkpoint_due(update) or stopping:
                run.save_checkpoint(update)  # written in the background while the next rollout runs
            if stopping:
                run.stop_after(update)  # every process ends here: Stopped, 128 + the signal
        if online and reward_model is None:  # a finished run resumed (or one killed in its closing report): no update
            reward_model, reward_hparams = online.last_model()  # ran here, and the report scores with the last model

    if ranks.is_main:
        print(f"saved policy to {run.dir / 'policy'}")
        task.report(args, tokenizer, policy, ref_policy, reward_model, reward_hparams.get("results", {}))
    return {"policy": policy, "ref_policy": ref_policy, "reward_model": reward_model, "stats": stats}


if __name__ == "__main__":
    run_main(main)
