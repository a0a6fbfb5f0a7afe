"""The offline task (`--task offline`): the whole method on a laptop CPU, a programmatic labeller in place of people.

Its preset and hooks: a gold-score metric each update, the end-of-run report (report.py). Like the original's offline
labels, ours come from sampling the initial policy four times per query and picking the best sample; the "human" is a
documented gold scorer (corpus.py), which also lets us check the reward model and the policy against the truth.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from lm_human_preference_details.offline.assets import ensure_offline_assets, offline_dir
from lm_human_preference_details.offline.corpus import (
    NUM_LABELS,
    NUM_TRAIN,
    QUERY_LENGTH,
    RESPONSE_LENGTH,
    TEMPERATURE,
    TRUNCATE_AFTER,
    TRUNCATE_TOKEN,
    gold_scores,
)
from lm_human_preference_details.offline.report import HELDOUT_QUERIES, HELDOUT_QUERIES_HOOK, report
from lm_human_preference_details.tasks import LabelHParams, Task, TaskHParams


@dataclass
class OfflineTask(Task):
    """The offline task: the books tasks' rules at a small scale, with the gold scorer's metric and report."""

    heldout_queries: int = HELDOUT_QUERIES
    """held-out queries the end-of-run report samples from the initial and the trained policy (256; fewer only in
    tests, through $LMHP_TEST_HELDOUT_QUERIES)"""

    def prepare(self) -> None:
        ensure_offline_assets()

    def gold_scores(self, tokenizer, responses: torch.Tensor) -> torch.Tensor:
        """[b, r] (truncated, padded) responses -> [b] gold scores: the `gold` labeller's (labellers.py)."""
        return gold_scores(tokenizer, responses)

    def extra_stats(self, tokenizer, data: dict) -> dict[str, float]:
        # the programmatic labeler's score of the update's (truncated) responses
        return {"ppo/objective/gold_score": gold_scores(tokenizer, data["postprocessed_responses"].cpu()).mean().item()}

    def report(self, args, tokenizer, policy, ref_policy, reward_model, reward_results: dict) -> dict:
        return report(policy, ref_policy, reward_model, tokenizer, args.task, args.rewards.target, Path(args.output_dir),
                      reward_results.get("heldout_accuracy"), self.heldout_queries)


def task() -> OfflineTask:
    """The offline preset: the books tasks' truncation, rejection and KL settings; sizes scaled down (README)."""
    d = offline_dir()
    return OfflineTask(
        base_model=str(d / "tiny-gpt2"),
        task=TaskHParams(query_length=QUERY_LENGTH, query_dataset=str(d / "queries.txt"), response_length=RESPONSE_LENGTH,
                         truncate_token=TRUNCATE_TOKEN, truncate_after=TRUNCATE_AFTER, temperature=TEMPERATURE),
        heldout_query_dataset=str(d / "queries_test.txt"),
        labels=LabelHParams(num_train=NUM_TRAIN, source=str(d / "labels.json")),
        train_reward={"batch_size": 8, "lr": 3e-3, "rollout_batch_size": 256, "normalize_samples": 256,
                      "eval_labels": NUM_LABELS - NUM_TRAIN},
        ppo={"total_episodes": 1920, "batch_size": 64, "lr": 2.5e-3, "whiten_rewards": True},  # 30 updates: docs/offline.md
        rewards={"kl_coef": 0.15, "adaptive_kl": True, "target": 6.0, "horizon": 10000},
        run={"exact_ranks": True},  # torchrun --nproc-per-node 2 gives the one-process run bit for bit (README)
        gpu_sized=False,  # minutes on a CPU: --device auto keeps the CPU
        heldout_queries=int(os.environ.get(HELDOUT_QUERIES_HOOK) or HELDOUT_QUERIES),
    )


def online_task() -> OfflineTask:
    """The offline preset online (paper, section 2.2; docs/online.md): the gold scorer labels samples of the current
    policy; as many labels in all as the offline preset trains on (N_r), a quarter of them (N_r^0) before PPO."""
    preset = task()
    preset.labels.num_train = NUM_TRAIN // 4  # N_r^0 = 384: the paper's summarisation runs began with a few labels
    preset.online = {"num_labels": NUM_TRAIN, "labeller": "gold", "margin": preset.ppo["batch_size"]}  # N_r = 1536
    return preset
