"""Train a reward model from best-of-4 human labels, as OpenAI's lm-human-preferences did.

    python train_reward.py --task sentiment              # OpenAI's labels, GPT-2 124M (GPU box)
    python train_reward.py --task offline                # tiny offline assets, minutes on a CPU

The algorithm (OAI lm_human_preferences/train_reward.py), in train() (main() parses and checks the flags):
  1. load the labels (best-of-4 over responses sampled from the initial policy);
  2. normalise the reward model on fresh policy samples to mean 0, std 1 (normalize_before);
  3. one epoch over --labels.num-train labels in one seeded permutation, softmax cross-entropy
     of the 4 rewards against the best, learning rate annealed linearly to 0, TF-1 Adam;
  4. normalise again (normalize_after), so the KL coefficient of PPO keeps its meaning;
  5. save the reward model (Hugging Face format + head, gain, bias + these hparams).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

# Before torch loads: large CPU tensors get 2 MiB pages, not 4 KiB ones faulted in one at a time (docs/speed.md)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")

import torch
import torch.nn.functional as F
import tyro

from lm_human_preference_details.cli.parsing import run_script
from lm_human_preference_details.cli.run_args import RunArgs
from lm_human_preference_details.label_format import check_enough_labels, check_label_source, load_best_of_n_labels
from lm_human_preference_details.language.gpt2 import compile_blocks
from lm_human_preference_details.language.model import Policy, RewardModel, load_lm
from lm_human_preference_details.language.tokenizer import encode_plain, load_tokenizer
from lm_human_preference_details.optim import TF1Adam, annealed_lr, set_lr
from lm_human_preference_details.queries import format_queries, make_query_sampler, print_first_query
from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.run.checkpoint import check_finite
from lm_human_preference_details.run.lifecycle import Run
from lm_human_preference_details.tasks import LabelHParams, TaskHParams, check_labels, get_task
from lm_human_preference_details.utils.checks import check_at_least, check_positive
from lm_human_preference_details.utils.downloads import fetch_oai
from lm_human_preference_details.utils.errors import UserError, run_main
from lm_human_preference_details.utils.progress import progress


@dataclass
class RewardTrainHParams:
    """How the reward model trains: labels and hyperparameters (OAI train_reward.py: HParams without task and run);
    a policy run that trains its reward model takes them as --rewards.train-new-model.*."""

    labels: LabelHParams = field(default_factory=LabelHParams)
    """where the labels come from (preset from --task)"""
    batch_size: int = 32
    """labels per training batch, all ranks together (launch.py: 32 books, 16 tldr/cnndm)"""
    lr: float = 5e-5
    """initial learning rate, annealed linearly to 0 over the epoch (launch.py: 5e-5 books, 2.5e-5 tldr/cnndm)"""
    rollout_batch_size: int = 512
    """queries per sampling batch when normalising (launch.py: 512 books, 128 tldr/cnndm)"""
    normalize_samples: int = 256
    """policy samples used to estimate the reward mean and std (launch.py: 256);
    --no-normalize-before and --no-normalize-after turn normalising off"""
    debug_normalize: int = 0
    """if > 0, this many fresh samples re-measure mean and std after each normalisation (train_reward.py)"""
    normalize_before: bool = True
    """normalise rewards on initial-policy samples before training (launch.py: on)"""
    normalize_after: bool = True
    """normalise rewards on initial-policy samples after training to mean 0, std 1 (launch.py: on)"""
    # DEVIATION: an extra metric, held-out accuracy on labels past num_train; training is unchanged
    eval_labels: int = 256
    """held-out labels after the first num_train for an accuracy metric; not in the original (0: off)"""

    def check_training(self) -> None:
        """The labels' and the training's numbers, each a one-line UserError naming the flag (as train_reward.py
        takes it); sets ``label_n``, the N of best_of_N."""
        check_at_least("--batch-size", self.batch_size, 1, "labels per training batch")
        self.label_n = check_labels(self.labels)
        check_at_least("--rollout-batch-size", self.rollout_batch_size, 1, "queries per sampling batch")
        check_at_least("--normalize-samples", self.normalize_samples, 1, "policy samples per normalisation")
        check_at_least("--debug-normalize", self.debug_normalize, 0, "samples re-measured (0: off)")
        check_at_least("--eval-labels", self.eval_labels, 0, "held-out labels (0: off)")
        check_positive("--lr", self.lr, "the initial learning rate")
        # OAI lm_human_preferences/train_reward.py: HParams.validate -> exact_div(num_train, batch_size)
        if self.labels.num_train % self.batch_size:
            raise UserError(f"labels.num_train ({self.labels.num_train}) must be divisible by batch_size "
                            f"({self.batch_size}); change --labels.num-train or --batch-size")


@dataclass
class Args(RunArgs, RewardTrainHParams):
    task: TaskHParams = field(default_factory=TaskHParams)
    """what a query and a response are (preset from --task)"""
    base_model: str = "gpt2"
    """Hugging Face name or local directory of the initial language model (launch.py: 124M)"""
    label_n: tyro.conf.Suppress[int] = 4
    """N of best_of_N, read from labels.type by check_training()"""

    def label_micro_batches(self, n: int, default: int | None = None) -> list[slice]:
        """The slices of ``n`` labels one forward pass takes: --micro-batch-sequences counts a label's N sequences."""
        return self.micro_batches(n, default, sequences_per_row=self.label_n)

    def finalize(self, check_inputs: bool = True) -> "Args":
        """Derived sizes and every check of the flags, each a one-line fix, before anything loads.

        ``check_inputs`` also reads what the flags name (the base model's files or hub config, the label file);
        tests of the presets alone leave it off.
        """
        self.check_run_options()
        self.check_training()
        # OAI lm_human_preferences/train_reward.py: per_rank_batch_size = exact_div(batch_size, num_ranks), and the
        # query sampler's exact_div(rollout_batch_size, num_ranks)
        for name, n in (("batch_size", self.batch_size), ("rollout_batch_size", self.rollout_batch_size)):
            if n % self.num_ranks:
                raise UserError(f"{name} ({n}) does not split into --num-ranks ({self.num_ranks}) equal shares; "
                                f"change --{name.replace('_', '-')} or --num-ranks")
        self.labels = self.labels.resolved()
        self.finalize_run("reward", check_inputs, self.labels.source, sequences_per_row=self.label_n,
                          batch_size=self.batch_size)
        if check_inputs:
            check_label_source(self.labels.source, n=self.label_n, query_length=self.task.query_length,
                               response_length=self.task.response_length, num_train=self.labels.num_train)
        return self


def build_args(task_name: str) -> Args:
    """The defaults of the `--task` preset."""
    task = get_task(task_name)
    return Args(task=task.task, labels=task.labels, base_model=task.base_model, task_name=task_name, **task.train_reward,
                **task.run)


def best_of_n_loss(rewards: torch.Tensor, best: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, N] rewards, [b] best index -> (softmax cross-entropy loss, accuracy of the argmax) (FIDELITY D2 best-of-N loss)."""
    # OAI lm_human_preferences/label_types.py: PickBest.loss (which logs this same loss as "error" too)
    loss = F.cross_entropy(rewards, best)
    accuracy = (rewards.argmax(dim=1) == best).float().mean()  # not in the original: an extra metric
    return loss, accuracy


def rewards_of_labels(reward_model: RewardModel, queries: torch.Tensor, samples: torch.Tensor) -> torch.Tensor:
    """[b, q] queries, [b, N, r] samples -> [b, N] rewards of each (query, sample) pair."""
    b, n, r = samples.shape
    flat_queries = queries.unsqueeze(1).expand(b, n, queries.shape[1]).reshape(b * n, -1)  # [b*N, q]
    return reward_model.score(flat_queries, samples.reshape(b * n, r)).view(b, n)  # [b, N]


@torch.no_grad()
def reward_stats(reward_model: RewardModel, policy: Policy, sampler: Iterator[torch.Tensor], args: Args, n_samples: int,
                 prefix: list[int], suffix: list[int], ranks: Ranks) -> tuple[float, float]:
    """Mean and population std of rewards of full-length initial-policy samples over all ranks (FIDELITY D6 normalize
    before)."""
    # OAI lm_human_preferences/train_reward.py: sample_policy_responses uses ceil(n / rollout_batch_size) batches
    rewards = []  # [blocks, rows] per batch: each rank's rewards apart with --exact-ranks
    n_batches = math.ceil(n_samples / args.rollout_batch_size)
    for _ in progress(range(n_batches), desc="sampling to normalise rewards", leave=False, disable=not ranks.is_main):
        queries = next(sampler).to(policy.head.weight.device)  # [rollout_batch_size / world_size, query_length]
        contexts = format_queries(queries, prefix, suffix)
        uniforms = ranks.draws.uniforms(len(queries) // len(ranks.held), args.task.response_length)  # each rank's own noise
        batch = []
        for mb in ranks.row_slices(len(queries), args.micro_batches):  # each rank's rows alone with --exact-ranks
            # responses are NOT truncated here: the original scores the raw samples
            responses = policy.sample(contexts[mb], args.task.response_length, uniforms=uniforms[mb])["responses"]
            batch.append(reward_model.score(queries[mb], responses))
        rewards.append(torch.cat(batch).view(ranks.blocks_per_process, -1))
    rewards = torch.cat(rewards, dim=1).double()  # [blocks, samples per block]
    # OAI lm_human_preferences/train_reward.py: stats, the sums of rewards and of their squares allreduce-summed
    local = torch.stack([rewards.sum(1), (rewards**2).sum(1), rewards.new_full((len(rewards),), rewards.shape[1])], 1)
    total, sum_sq, count = ranks.gather_blocks(local).sum(0)  # [3]: each rank's sums, added in rank order
    mean = (total / count).item()
    std = math.sqrt(max((sum_sq / count).item() - mean**2, 0.0))  # population std
    return mean, std


def normalize(reward_model: RewardModel, stats_fn, args: Args, target_mean: float, target_std: float) -> dict[str, float]:
    """Set gain and bias so rewards on policy samples have the target mean and std (FIDELITY D6 normalize before, D7 normalize
    after)."""
    # OAI lm_human_preferences/train_reward.py: RewardModelTrainer.normalize
    reward_model.reset_reward_scale()
    mean, std = stats_fn(args.normalize_samples)
    reward_model.set_reward_norm(old_mean=mean, old_std=std, new_mean=target_mean, new_std=target_std)
    out = {"mean_before": mean, "std_before": std, "gain": reward_model.gain.item(), "bias": reward_model.bias.item()}
    if args.debug_normalize:
        out["mean_after"], out["std_after"] = stats_fn(args.debug_normalize)
    return out


def normalize_and_log(reward_model: RewardModel, stats_fn, args: Args, run: Run, name: str, step: int) -> None:
    """`normalize` to mean 0, std 1 (best_of_N's targets: label_types.py target_scales is None), logged as ``name``."""
    norm = normalize(reward_model, stats_fn, args, target_mean=0.0, target_std=1.0)
    run.log({f"train_reward/{name}/{k}": v for k, v in norm.items()}, step=step)
    run.print(f"{name}: {norm}")


def split_labels(args: Args, path: Path, pad_id: int) -> tuple[dict, dict, int]:
    """OpenAI's label file (FIDELITY A2 OAI pad remap: 50259 -> ours) -> (the first num_train labels, the held-out ones
    after them, the file's count)."""
    labels = load_best_of_n_labels(path, n=args.label_n, query_length=args.task.query_length,
                                   response_length=args.task.response_length, pad_id=pad_id)
    n_total, n_train = len(labels["best"]), args.labels.num_train
    check_enough_labels(path, n_total, n_train)  # a URL's file, downloaded since Args.finalize
    return ({k: v[:n_train] for k, v in labels.items()},
            {k: v[n_train : n_train + args.eval_labels] for k, v in labels.items()}, n_total)


def label_loss(reward_model: RewardModel, labels: dict[str, torch.Tensor], idx: torch.Tensor,
               device: torch.device) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The best-of-N loss of labels ``idx`` -> (loss, statistics)."""
    # OAI lm_human_preferences/train_reward.py: RewardModelTrainer.train, label_type.loss on the minibatch
    rewards = rewards_of_labels(reward_model, labels["queries"][idx].to(device),
                                labels["samples"][idx].to(device))  # [labels, N]
    loss, accuracy = best_of_n_loss(rewards, labels["best"][idx].to(device))
    return loss, {"loss": loss, "accuracy": accuracy}


def train_epoch(run: Run, ranks: Ranks, reward_model: RewardModel, labels: dict[str, torch.Tensor], args: Args,
                n_batches: int) -> None:
    """One epoch of ``n_batches`` batches over the first num_train labels in one seeded permutation drawn by rank 0, the
    learning rate annealed linearly to 0, TF-1 Adam (FIDELITY D3 one epoch)."""
    # OAI lm_human_preferences/train_reward.py: RewardModelTrainer.train, its loop over minibatches
    device = ranks.device
    optimizer = TF1Adam(reward_model.parameters(), lr=args.lr, eps=1e-5)
    permutation = torch.from_numpy(ranks.draws.shared_permutation(args.labels.num_train))
    for batch in run.updates(0, n_batches, "reward model", show={"loss": "train_reward/minibatch/loss",
                                                                 "lr": "train_reward/minibatch/lr"}):
        start = batch * args.batch_size
        lr = annealed_lr(args.lr, start, args.labels.num_train)
        set_lr(optimizer, lr)
        indices = ranks.rank_rows(permutation[start : start + args.batch_size])  # the held ranks' labels
        optimizer.zero_grad(set_to_none=True)

        def loss_fn(rows: slice) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # rows: positions in indices
            return label_loss(reward_model, labels, indices[rows], device)

        # E10 gradient averaging: loss.backward() micro-batch by micro-batch, the gradient averaged over every rank
        stats = ranks.backward(loss_fn, len(indices), reward_model.parameters(), args.label_micro_batches)
        optimizer.step()
        # the original logs its loss twice, as loss and as error (label_types.py PickBest.loss), allreduce-averaged
        loss_mean, accuracy_mean = ranks.mean_over_blocks(torch.stack([stats["loss"], stats["accuracy"]], 1)).tolist()
        check_finite(f"reward model batch {batch}", loss=loss_mean)
        run.log({"train_reward/minibatch/loss": loss_mean, "train_reward/minibatch/error": loss_mean,
                 "train_reward/minibatch/accuracy": accuracy_mean, "train_reward/minibatch/lr": lr}, step=batch)
        if run.stop_requested(batch):  # no checkpoint within the one epoch (as the original): a stop trains it again
            run.stop_after(batch)


def heldout_results(run: Run, reward_model: RewardModel, labels: dict, args: Args, device, step: int) -> dict:
    """The held-out accuracy (extra metric, none without held-out labels), logged and printed."""
    if not len(labels["best"]):
        return {}
    accuracy = heldout_accuracy(reward_model, labels, args, device)
    run.log({"train_reward/eval/accuracy": accuracy}, step=step)
    run.print(f"held-out accuracy on {len(labels['best'])} labels: {accuracy:.3f} (chance {1 / args.label_n:.2f})")
    return {"heldout_accuracy": accuracy}


@torch.no_grad()
def heldout_accuracy(reward_model: RewardModel, labels: dict[str, torch.Tensor], args: Args, device) -> float:
    """Fraction of held-out labels whose best sample gets the highest reward (extra metric)."""
    correct = 0
    for mb in args.label_micro_batches(len(labels["best"]), default=args.batch_size):
        rewards = rewards_of_labels(reward_model, labels["queries"][mb].to(device), labels["samples"][mb].to(device))
        correct += (rewards.argmax(1).cpu() == labels["best"][mb]).sum().item()
    return correct / len(labels["best"])


def main(argv: list[str] | None = None) -> Path:
    return run_script(build_args, train, __doc__, argv)


def train(args: Args) -> Path:
    """Train, normalise and save a reward model; returns the saved directory (on every process)."""
    # E9 per-rank seeds: the emulated ranks this process holds (all of them without torchrun)
    ranks = Ranks.start(args, get_task(args.task_name).gpu_sized)
    device = ranks.device
    compile_blocks(args.compile)
    # no checkpoints within this phase (minutes long): --resume reuses a finished reward model or trains it again
    with Run(args, "reward", inputs=[args.base_model, args.labels.source, args.task.query_dataset], ranks=ranks) as run:
        if run.finished:
            return run.dir / "reward_model"
        # 1. labels: OpenAI's schema, pads 50259 mapped to ours (FIDELITY A2 OAI pad remap)
        with ranks.agree():  # built or downloaded once per cache under its lock (files.cache_lock), whoever comes first
            get_task(args.task_name).prepare()
            label_path = fetch_oai(args.labels.source)
        tokenizer = load_tokenizer(args.base_model)
        pad_id = tokenizer.pad_token_id
        train_labels, eval_labels, n_total = split_labels(args, label_path, pad_id)

        # the initial policy samples the normalisation queries; the reward model starts from the same LM
        policy = Policy(load_lm(args.base_model), pad_id, args.task.temperature).to(device).requires_grad_(False)
        reward_model = RewardModel(load_lm(args.base_model), pad_id).to(device)
        ranks.broadcast_parameters(reward_model)  # OAI train_reward.py: sync_models, every rank starts from rank 0's weights
        # E9 per-rank seeds: each held rank draws its block of every batch from its own query stream
        sampler = make_query_sampler(tokenizer, args.task, batch_size=args.rollout_batch_size, seed=args.seed,
                                     num_ranks=args.num_ranks, ranks=ranks.held, labels_source=str(label_path))
        prefix, suffix = encode_plain(tokenizer, [args.task.query_prefix, args.task.query_suffix])

        stats_fn = functools.partial(reward_stats, reward_model, policy, sampler, args, prefix=prefix, suffix=suffix,
                                     ranks=ranks)  # n samples -> their rewards' mean and std
        config = dataclasses.asdict(args)
        run.start(config, tokenizer=tokenizer)
        print_first_query(sampler, run.print)  # the fork's `=========== <text>`: compare with a baseline run's log
        n_batches = args.labels.num_train // args.batch_size
        run.print(f"train_reward: {args.labels.num_train} labels ({n_total} in file, {len(eval_labels['best'])} held out), "
                  f"{n_batches} batches of {args.batch_size}, {args.num_ranks} ranks on {ranks.world_size} process(es), "
                  f"device {device}, run dir {run.dir}")

        # 2. normalise before training (best_of_N targets mean 0, std 1: label_types.py target_scales is None)
        if args.normalize_before:
            normalize_and_log(reward_model, stats_fn, args, run, "normalize_before", step=0)

        # 3. one epoch over num_train labels, one seeded permutation drawn by rank 0 (FIDELITY D3 one epoch)
        train_epoch(run, ranks, reward_model, train_labels, args, n_batches)

        results = heldout_results(run, reward_model, eval_labels, args, device, step=n_batches)

        # 4. normalise after training to mean 0, std 1, so kl_coef keeps its meaning (FIDELITY D7 normalize after)
        if args.normalize_after:
            normalize_and_log(reward_model, stats_fn, args, run, "normalize_after", step=n_batches)

        # 5. save: Hugging Face LM + head, gain, bias + hparams (FIDELITY D8 saved gain and bias); never a non-finite model
        check_finite("the end of reward model training", weights=reward_model)
        save_dir = run.save_model("reward_model", reward_model, {**config, "results": results})
        run.print(f"saved reward model to {save_dir}")
        return save_dir


if __name__ == "__main__":
    run_main(main)
