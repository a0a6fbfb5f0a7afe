"""The offline task's end-of-run report: gold and reward-model scores of the initial and the trained policy on
held-out queries, and the KL between them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from lm_human_preference_details.offline.assets import offline_dir
from lm_human_preference_details.offline.corpus import gold_scores
from lm_human_preference_details.ppo import apply_rejection, responses_pass_filter, truncate_responses
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.run.plots import write_run_curves
from lm_human_preference_details.tasks import TaskHParams
from lm_human_preference_details.utils.files import atomic_path

HELDOUT_QUERIES = 256  # the report's held-out queries, sampled from each policy: 8.6 CPU s of a run's ~240 (docs/offline.md)


# tests' hook: a smaller count for the report of a run whose numbers a test only compares (a table against summary.json),
# not reads as results; unset in every real run (as checkpoint.py's $LMHP_TEST_EVENTS)
HELDOUT_QUERIES_HOOK = "LMHP_TEST_HELDOUT_QUERIES"


def heldout_queries(tokenizer, task, n: int, seed: int) -> torch.Tensor:
    """[n, query_length] queries from the held-out passages (queries_test.txt), processed as the run's text queries;
    for a run on the label file's queries (oai-label-queries), as make_labels cut those from the same corpus."""
    texts = task.source.path is not None  # a local file of texts, not a named source
    heldout = TaskHParams(query_dataset=str(offline_dir() / "queries_test.txt"), query_length=task.query_length,
                          start_text=task.start_text if texts else ".", end_text=task.end_text if texts else ".")
    return next(make_query_sampler(tokenizer, heldout, batch_size=n, seed=seed, num_ranks=1, shuffle_seed=seed))


@torch.no_grad()
def evaluate(policy, ref_policy, reward_model, tokenizer, task, n: int = HELDOUT_QUERIES,
             seed: int = 12345) -> dict[str, float]:
    """Gold and reward-model scores of the initial and the trained policy on held-out queries, and the KL."""
    queries = heldout_queries(tokenizer, task, n, seed).to(policy.head.weight.device)
    contexts = format_queries(queries, [], [])
    out = {}
    for name, model in (("initial", ref_policy), ("trained", policy)):
        g = torch.Generator(device=queries.device).manual_seed(seed)
        sampled = model.sample(contexts, task.response_length, generator=g)
        post = truncate_responses(sampled["responses"], task.truncate_token, task.truncate_after, tokenizer.pad_token_id)
        scores = apply_rejection(reward_model.score(queries, post),
                                 responses_pass_filter(post, task.truncate_token, task.truncate_after),
                                 task.penalty_reward_value)
        gold = gold_scores(tokenizer, post.cpu())
        out[f"{name}/gold_mean"], out[f"{name}/gold_std"] = gold.mean().item(), gold.std().item()
        out[f"{name}/score_mean"] = scores.mean().item()
        if name == "trained":
            ref_logprobs = ref_policy.analyze_responses(contexts, sampled["responses"])["logprobs"]
            out["trained/kl"] = (sampled["logprobs"] - ref_logprobs).sum(1).mean().item()
    out["gold_gain_in_initial_stds"] = gain_in_stds(out["trained/gold_mean"], out["initial/gold_mean"],
                                                    out["initial/gold_std"])
    return out


def gain_in_stds(after: float, before: float, std: float) -> float:
    """(after - before) / std; NaN where every initial sample scored the same (std 0): the report of a finished run
    says the gain is undefined rather than ending in a traceback."""
    return (after - before) / std if std > 0 else math.nan


def report(policy, ref_policy, reward_model, tokenizer, task, kl_target: float, run_dir: Path,
           reward_accuracy: float | None, n: int = HELDOUT_QUERIES) -> dict:
    """The offline task's closing summary, on ``n`` held-out queries: printed, and written to run_dir/summary.json and
    curves.png."""
    summary = {"reward_model/heldout_accuracy": reward_accuracy, "kl_target": kl_target,
               **evaluate(policy, ref_policy, reward_model, tokenizer, task, n)}
    write_run_curves(run_dir)  # the run's curves.png, its gold score panel included
    with atomic_path(run_dir / "summary.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=2))
    acc = "n/a" if reward_accuracy is None else f"{reward_accuracy:.3f}"
    print(f"offline task summary ({run_dir / 'summary.json'}, curves in {run_dir / 'curves.png'}):\n"
          f"  reward model held-out accuracy against gold labels: {acc} (chance 0.25)\n"
          f"  gold score    initial {summary['initial/gold_mean']:+.3f} (std {summary['initial/gold_std']:.3f})"
          f"  ->  trained {summary['trained/gold_mean']:+.3f}  ({summary['gold_gain_in_initial_stds']:+.2f} initial stds)\n"
          f"  reward score  initial {summary['initial/score_mean']:+.3f}  ->  trained {summary['trained/score_mean']:+.3f}\n"
          f"  final KL      {summary['trained/kl']:.2f} nats (target {kl_target})")
    return summary
