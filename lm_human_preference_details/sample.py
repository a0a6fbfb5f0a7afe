"""Sample a policy on held-out queries, optionally score the samples, and show them (OAI sample.py).

    python -m lm_human_preference_details.sample --task offline --policy runs/policy_offline_seed1/policy --compare initial
    python -m lm_human_preference_details.sample --task descriptiveness --policy oai:descriptiveness \\
        --reward-model oai:descriptiveness --compare initial

Each query of the task's test split is processed and formatted as in training (FIDELITY A4 query processing, A5 query
formatting); each policy
draws samples_per_query responses of exactly response_length tokens at the task's temperature (C1 plain sampling). With
--compare, a second policy answers the same queries with the same random draws (the same torch.Generator
seed). With --reward-model, responses are truncated and rejected as PPO scores them (E2 truncate and score). The samples are
printed as a table, written to OUTPUT_DIR/samples.jsonl, and with --track logged as a W&B table.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch
import tyro

from lm_human_preference_details.cli.parsing import parse_args
from lm_human_preference_details.language.model import Policy, RewardModel, load_model_dir
from lm_human_preference_details.language.tokenizer import decode, encode_plain, load_tokenizer
from lm_human_preference_details.language.trained_models import (
    check_policy_path,
    load_policy,
    resolve_policy,
    resolve_reward_model,
)
from lm_human_preference_details.ppo import apply_rejection, responses_pass_filter, truncate_responses
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.ranks.devices import pick_device
from lm_human_preference_details.ranks.emulated import Ranks, check_seed
from lm_human_preference_details.run.lifecycle import Run
from lm_human_preference_details.run.tracking import Tracker
from lm_human_preference_details.tasks import TaskHParams, get_task, positions_needed
from lm_human_preference_details.utils.checks import check_output_dir, expand_home
from lm_human_preference_details.utils.errors import UserError, run_main
from lm_human_preference_details.utils.outputs import new_or_ours

INITIAL = "initial"  # --compare initial: the base model the policy was fine-tuned from


@dataclass
class Args:
    task: TaskHParams = field(default_factory=TaskHParams)
    """query processing, response length, temperature, truncation (preset from --task; every field overridable)"""
    policy: Optional[str] = None
    """a directory saved by train_policy.py, oai:NAME (OpenAI's released run), an OAI TF policy directory or any causal LM;
    default runs/policy_<task>_seed1/policy, train_policy.py's default"""
    compare: Optional[str] = None
    """a second policy, sampled on the same queries with the same random draws; 'initial' = the policy's base model"""
    reward_model: Optional[str] = None
    """score the samples: a directory saved by train_reward.py, oai:NAME or an OAI TF reward_model directory"""
    num_queries: int = 8
    """held-out queries to sample (OAI sample.py: batch_size 4 per rank)"""
    samples_per_query: int = 2
    """responses drawn per query and policy"""
    query_mode: Literal["auto", "test", "train"] = "auto"
    """which queries: test (held out), train, or auto: test where the source has a test split, else train;
    the baseline's Hugging Face sources have only a train split (OAI sample.py reads mode='test')"""
    seed: int = 1
    """seed of the query order and of the sampling draws (the same for both policies)"""
    device: str = "auto"
    """torch device: auto (cuda if available), cpu, cuda ..."""
    output_dir: Optional[str] = None
    """where samples.jsonl and the TensorBoard table go (default runs/sample_<task>_seed<seed>);
    a new or empty directory, or one this tool wrote with --overwrite (docs/runs.md, the run-directory rules)"""
    overwrite: bool = False
    """replace the samples in --output-dir written by an earlier `sample` (without it, such a directory is refused)"""
    track: bool = False
    """also log the table to Weights & Biases"""
    wandb_project: str = "lm-human-preferences"
    """W&B project"""
    wandb_entity: Optional[str] = None
    """W&B entity (team or user)"""
    base_model: tyro.conf.Suppress[str] = "gpt2"
    task_name: tyro.conf.Suppress[str] = "sentiment"
    resume: tyro.conf.Suppress[bool] = False
    """what run.Run reads with --overwrite: sampling has nothing to continue"""

    def finalize(self) -> "Args":
        """Defaults that depend on the task, and one-line errors for bad sizes."""
        if self.num_queries < 1 or self.samples_per_query < 1:
            raise UserError(f"--num-queries ({self.num_queries}) and --samples-per-query ({self.samples_per_query}) "
                            "must be positive")
        check_seed(self.seed, 1)
        if self.query_mode == "auto":
            self.query_mode = self.task.source.heldout_mode()
        self.task.source.check_mode(self.query_mode)  # the source's modes, before any policy is read
        default = self.policy is None
        if default:
            self.policy = f"runs/policy_{self.task_name}_seed1/policy"
        # each path flag resolved once (cli.expand_home): every check and write below uses these values
        self.policy, self.compare, self.reward_model = map(expand_home, (self.policy, self.compare, self.reward_model))
        check_policy_path("--policy", self.policy, self.task_name if default else None, positions_needed(self.task))
        if self.compare not in (None, INITIAL):
            check_policy_path("--compare", self.compare, None, positions_needed(self.task))
        if self.output_dir is None:
            self.output_dir = f"runs/sample_{self.task_name}_seed{self.seed}"
        self.output_dir = expand_home(self.output_dir)
        check_output_dir(self.output_dir)  # a file, a path under a file, a dangling link: refused before any sampling
        heldout = get_task(self.task_name).heldout_query_dataset
        if self.query_mode == "test" and heldout and self.task.query_dataset == get_task(self.task_name).task.query_dataset:
            # a task whose local corpus keeps its test passages in a file of their own (the offline demo)
            self.task = dataclasses.replace(self.task, query_dataset=heldout)
        self.task = self.task.resolved()
        return self


def build_args(task_name: str) -> Args:
    """The defaults of the `--task` preset."""
    task = get_task(task_name)
    return Args(task=task.task, base_model=task.base_model, task_name=task_name)


@torch.no_grad()
def sample_policy(policy: Policy, contexts: torch.Tensor, length: int, seed: int) -> torch.Tensor:
    """[b, c] contexts -> [b, length] responses, drawn with a generator seeded by ``seed`` (FIDELITY C1 plain sampling)."""
    # OAI sample.py: sample_policy -> policy.respond(queries, length=task.response_length)
    generator = torch.Generator(device=contexts.device).manual_seed(seed)
    return policy.sample(contexts, length, generator=generator)["responses"]


@torch.no_grad()
def score_responses(reward_model: RewardModel, queries: torch.Tensor, postprocessed: torch.Tensor,
                    task: TaskHParams) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, q] queries, [b, r] truncated responses -> (scores [b], passed the filter [b]) (FIDELITY E2 truncate and score)."""
    # OAI lm_human_preferences/train_policy.py: make_score_fn (score the truncated responses, penalize)
    passed = responses_pass_filter(postprocessed, task.truncate_token, task.truncate_after)
    return apply_rejection(reward_model.score(queries, postprocessed), passed, task.penalty_reward_value), passed


def format_table(rows: list[dict], names: list[str]) -> str:
    """A readable table: each query once, then each policy's responses (and scores) under it."""
    width = max(len(n) for n in names)
    lines = []
    for i, row in enumerate(r for r in rows if r["policy"] == names[0] and r["sample"] == 0):
        lines += ["=" * 100, f"query {i}: {row['query']!r}"]
        for r in rows:
            if r["query_index"] == row["query_index"]:
                score = f"  score {r['score']:+.3f}" if r["score"] is not None else ""
                lines.append(f"  {r['policy']:<{width}} #{r['sample']}{score}  {r['response']!r}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(build_args, __doc__.split("\n")[0], argv).finalize()
    inputs = [args.policy, args.compare, args.reward_model, args.task.query_dataset]
    # the run-directory rules of the training scripts, checked and the directory marked before any sampling;
    # a failure before the samples are written leaves nothing behind
    with Run(args, "sample", inputs=inputs, ranks=Ranks(1, args.seed)) as run:
        return sample_into(args, run)


def sample_into(args: Args, run: Run) -> list[dict]:
    """Sample every policy on the same queries, print the table, and write samples.jsonl and the tracker into the run's
    directory."""
    out = run.dir
    get_task(args.task_name).prepare()
    device = pick_device(args.device)
    task = args.task
    tokenizer = load_tokenizer(resolve_policy(args.policy))
    policy, base = load_policy(args.policy, tokenizer, task.temperature, device)
    policies, sources = {"policy": policy}, {"policy": args.policy}
    if args.compare is not None:
        name = INITIAL if args.compare == INITIAL else "compare"
        sources[name] = base if args.compare == INITIAL else args.compare
        policies[name], _ = load_policy(sources[name], tokenizer, task.temperature, device)
    reward_model = None
    if args.reward_model is not None:
        reward_model, reward_tokenizer, _ = load_model_dir(resolve_reward_model(args.reward_model), "reward", device)
        if reward_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise UserError(f"reward model {args.reward_model} uses another tokenizer than the policy")

    # OAI sample.py: held-out queries (mode='test'), processed and formatted as in training
    sampler = make_query_sampler(tokenizer, task, batch_size=args.num_queries, seed=args.seed, num_ranks=1,
                                 mode=args.query_mode, shuffle_seed=args.seed)
    queries = next(sampler).to(device)  # [num_queries, query_length]
    queries = queries.repeat_interleave(args.samples_per_query, dim=0)  # [num_queries * samples_per_query, q]
    prefix, suffix = encode_plain(tokenizer, [task.query_prefix, task.query_suffix])
    contexts = format_queries(queries, prefix, suffix)  # [b, p + q + s]

    rows = []
    for name, policy in policies.items():
        # the same seed for every policy: the same uniforms drive their draws (OAI sample.py: set_mpi_seed(seed))
        responses = sample_policy(policy, contexts, task.response_length, args.seed)  # [b, response_length]
        # OAI lm_human_preferences/lm_tasks.py: postprocess_fn_from_hparams, as PPO scores them (E2 truncate and score)
        postprocessed = truncate_responses(responses, task.truncate_token, task.truncate_after, tokenizer.pad_token_id)
        scores = passed = None
        if reward_model is not None:
            scores, passed = score_responses(reward_model, queries, postprocessed, task)
        for i in range(len(queries)):
            rows.append({
                "policy": name, "source": sources[name],
                "query_index": i // args.samples_per_query, "sample": i % args.samples_per_query,
                "query": decode(tokenizer, queries[i].tolist()), "response": decode(tokenizer, postprocessed[i].tolist()),
                "score": None if scores is None else scores[i].item(),
                "passed_filter": None if passed is None else bool(passed[i]),
                # the response as shown and scored (truncated, pads left out), and the draw as sampled
                "query_tokens": queries[i].tolist(),
                "response_tokens": [t for t in postprocessed[i].tolist() if t != tokenizer.pad_token_id],
                "sampled_tokens": responses[i].tolist(),
            })

    names = list(policies)
    print(format_table(rows, names))
    write_samples(run, rows)
    tracker = Tracker(out, dataclasses.asdict(args), track=args.track, project=args.wandb_project,
                      entity=args.wandb_entity, name=f"sample_{args.task_name}_seed{args.seed}")
    columns = ["policy", "query_index", "sample", "query", "response", "score"]
    tracker.log_table("samples", columns, [[r[c] for c in columns] for r in rows], step=0)
    if reward_model is not None:
        means = {n: sum(r["score"] for r in rows if r["policy"] == n) / len(queries) for n in names}
        tracker.log({f"sample/{n}/score_mean": m for n, m in means.items()}, step=0)
        print("mean score: " + ", ".join(f"{n} {m:+.3f}" for n, m in means.items()))
    tracker.close()
    print(f"wrote {out / 'samples.jsonl'}")
    return rows


def write_samples(run: Run, rows: list[dict]) -> None:
    """RUN/samples.jsonl, one row per line. The run directory held none when the run began (--overwrite deleted the
    last run's): one that appeared while sampling is someone else's and stays as it is (docs/runs.md: never over a file
    the project did not write, never through a link); the samples are refused in one line and our marker goes, so that
    no later --overwrite takes that file for ours."""
    path = run.dir / "samples.jsonl"
    try:
        with new_or_ours(path, ours=lambda existing: False) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in rows))
    except FileExistsError:
        run.directory.remove_if_empty(beside_others=True)  # nothing of ours is in it yet
        raise UserError(f"{path} appeared while sampling, and this run did not write it; it is left as it is: move it "
                        "away and run the same command again") from None


def cli() -> None:
    """The console script lmhp-sample (pyproject.toml), as `python -m lm_human_preference_details.sample`."""
    run_main(main)


if __name__ == "__main__":
    cli()
