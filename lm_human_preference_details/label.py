"""Label best-of-4 samples yourself: a local page that writes OpenAI's label schema (docs/labelling.md).

    python -m lm_human_preference_details.label --task offline --output my_labels.json
    python train_reward.py --task offline --labels.source my_labels.json --labels.num-train 96 --batch-size 8

The items are drawn once, from the seed: --num-queries queries of the task's training stream (processed and
formatted as in training, FIDELITY A4 query processing, A5 query formatting), four responses each from the policy (the task's
base model, or --policy)
at the task's temperature and response length (C1 plain sampling), truncated as PPO scores them and as OpenAI's labellers saw
them
(E2 truncate and score). A page served by the standard library on 127.0.0.1 (another address only with --host) shows each query
with its
four responses; each choice is journaled and written to --output at once (labelling/session.py). Run the same command
again to continue where you stopped. Several people may label at once, each under the name they give the page; with
--labels-per-item K an item is shown to K of them (docs/labelling.md, "Several labellers").
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import torch
import tyro

from lm_human_preference_details.cli.parsing import parse_args
from lm_human_preference_details.label_format import OAI_PAD
from lm_human_preference_details.labelling.journal import N_SAMPLES, TRAIN_ON
from lm_human_preference_details.labelling.server import LabelServer, who_can_reach
from lm_human_preference_details.labelling.session import LabelSession, check_output_path
from lm_human_preference_details.language.tokenizer import decode, encode_plain, load_tokenizer
from lm_human_preference_details.language.trained_models import check_policy_path, load_policy, resolve_policy
from lm_human_preference_details.ppo import truncate_responses
from lm_human_preference_details.queries import format_queries, make_query_sampler
from lm_human_preference_details.ranks.devices import pick_device
from lm_human_preference_details.ranks.emulated import check_seed
from lm_human_preference_details.tasks import TaskHParams, check_task, check_task_inputs, get_task, positions_needed
from lm_human_preference_details.utils.checks import check_at_least
from lm_human_preference_details.utils.errors import Interrupted, UserError, run_main
from lm_human_preference_details.utils.progress import progress

CHUNK = 64  # queries sampled per forward pass


@dataclass
class Args:
    task: TaskHParams = field(default_factory=TaskHParams)
    """query processing, response length, temperature, truncation (preset from --task; every field overridable)"""
    output: Optional[str] = None
    """the label file to write, OpenAI's best_of_4 schema (default labels_<task>_seed<seed>.json);
    an existing one is continued only if a session of this tool wrote it"""
    base_model: str = "gpt2"
    """the policy sampled when --policy is not given: Hugging Face name or local directory (the task's initial model)"""
    policy: Optional[str] = None
    """a trained policy to sample instead: RUN/policy saved by train_policy.py, oai:NAME or an OAI TF policy directory"""
    num_queries: int = 100
    """queries to label, four responses each"""
    seed: int = 1
    """seed of the query order and of the sampling draws: the same seed gives the same items"""
    labels_per_item: int = 1
    """labels wanted for each of the first --repeat-share of the items, each from another labeller; the others want one.
    Each labeller gives the page a name.
    The paper's practice: a share of the items labelled more than once, to measure agreement (the agreement command)."""
    repeat_share: float = 1.0
    """the share of the items, 0..1, that want --labels-per-item labels; the others want one.
    They are the first round(share * --num-queries) items of the seeded order (halves up)."""
    train_on: Literal["first", "majority"] = "first"
    """which label of an item is its `best`, the one train_reward.py trains on: first, the item's first label;
    majority, the sample most labellers chose, a tie settled by the earliest label among the tied samples"""
    host: str = "127.0.0.1"
    """address the page is served on; anything but a loopback address lets other machines label"""
    port: int = 8765
    """TCP port of the page (0: any free port)"""
    device: str = "auto"
    """torch device for sampling: auto (cuda if available), cpu, cuda ..."""
    task_name: tyro.conf.Suppress[str] = "sentiment"
    labels_source: tyro.conf.Suppress[str] = ""

    def finalize(self) -> "Args":
        """The task's defaults, and a one-line error for each bad flag, before anything is loaded or written."""
        check_at_least("--num-queries", self.num_queries, 1, "queries to label")
        check_seed(self.seed, 1)
        check_at_least("--labels-per-item", self.labels_per_item, 1, "labels wanted for an item")
        if not 0 <= self.repeat_share <= 1:  # NaN too
            raise UserError(f"--repeat-share {self.repeat_share} is not a share; pass a number in 0..1 (the share of the "
                            "items that want --labels-per-item labels)")
        if self.train_on not in TRAIN_ON:
            raise UserError(f"--train-on {self.train_on!r} is not one of {', '.join(TRAIN_ON)}; pass one of them")
        if not 0 <= self.port <= 65535:
            raise UserError(f"--port {self.port} is not a TCP port; pass 1..65535, or 0 for any free port")
        if not self.host.strip():  # an empty address binds every interface of the machine: never by accident
            raise UserError("--host is empty; pass an address of this machine (127.0.0.1: this machine only, or "
                            "0.0.0.0 to serve every interface on purpose)")
        if self.output is None:
            self.output = f"labels_{self.task_name}_seed{self.seed}.json"
        if not self.output.strip():
            raise UserError("--output is empty; pass the path of the label file to write")
        check_output_path(self.output, inputs=[self.base_model, self.policy, self.task.query_dataset])
        check_task(self.task)
        self.task = self.task.resolved()
        if self.policy is not None:
            check_policy_path("--policy", self.policy, None, positions_needed(self.task))
        get_task(self.task_name).prepare()  # a task's local assets, before their files are checked
        check_task_inputs(self.task, self.base_model, self.labels_source)
        return self

    def policy_source(self) -> str:
        """What samples the responses: --policy, else --base-model."""
        return self.policy or self.base_model

    def session_flags(self) -> dict:
        """The flags that fix a session's items: a session continues only with the same."""
        return {"task_name": self.task_name, "task": dataclasses.asdict(self.task), "policy": self.policy_source(),
                "num_queries": self.num_queries, "seed": self.seed, "labels_per_item": self.labels_per_item,
                "repeat_share": self.repeat_share, "train_on": self.train_on}


def build_args(task_name: str) -> Args:
    """The defaults of the `--task` preset."""
    task = get_task(task_name)
    return Args(task=task.task, base_model=task.base_model, task_name=task_name, labels_source=task.labels.source)


def to_oai(tokens: list[int], pad_id: int) -> list[int]:
    """Our pad -> OpenAI's 50259, as their label files hold it."""
    # A2 OAI pad remap: the file is read back with 50259 mapped to our pad (label_format.py), so it never reaches a model
    return [OAI_PAD if t == pad_id else t for t in tokens]


@torch.no_grad()
def sample_items(args: Args, device: torch.device) -> list[dict]:
    """The session's items, fixed by --seed: each query with four truncated responses, as tokens (OpenAI's pads) and
    as the texts the page shows."""
    task, source = args.task, args.policy_source()
    tokenizer = load_tokenizer(resolve_policy(source))
    # A4 query processing: the training stream's first num_queries queries, in the order the seed shuffles them
    sampler = make_query_sampler(tokenizer, task, batch_size=args.num_queries, seed=args.seed, num_ranks=1,
                                 labels_source=args.labels_source, shuffle_seed=args.seed)
    queries = next(sampler)  # [num_queries, query_length]
    one_pass = sampler.queries_per_pass()
    if one_pass is not None and args.num_queries > one_pass:  # the stream repeats: items would be asked twice
        raise UserError(f"--num-queries {args.num_queries} is more than the {one_pass} queries of "
                        f"{task.query_dataset}'s training stream; pass --num-queries {one_pass} or less")
    policy, _ = load_policy(source, tokenizer, task.temperature, device)
    prefix, suffix = encode_plain(tokenizer, [task.query_prefix, task.query_suffix])
    generator = torch.Generator(device=device).manual_seed(args.seed)
    items = []
    for start in progress(range(0, len(queries), CHUNK), desc="sampling the items", unit="batch"):
        chunk = queries[start : start + CHUNK].to(device)  # [c, query_length]
        contexts = format_queries(chunk, prefix, suffix).repeat_interleave(N_SAMPLES, dim=0)  # [c * 4, p + q + s]
        # C1 plain sampling: exactly response_length tokens at the task's temperature
        responses = policy.sample(contexts, task.response_length, generator=generator)["responses"]
        # E2 truncate and score: cut after the first truncate_token at index >= truncate_after, as PPO scores a response
        # and as OpenAI's labellers were shown it (its label files hold truncated, padded samples)
        samples = truncate_responses(responses, task.truncate_token, task.truncate_after, tokenizer.pad_token_id)
        samples = samples.view(len(chunk), N_SAMPLES, task.response_length).tolist()  # [c, 4, response_length]
        for query, four in zip(chunk.tolist(), samples):
            items.append({
                "query": to_oai(query, tokenizer.pad_token_id),
                "samples": [to_oai(s, tokenizer.pad_token_id) for s in four],
                "query_text": task.query_prefix + decode(tokenizer, query) + task.query_suffix,
                "sample_texts": [decode(tokenizer, s) for s in four],
            })
    return items


def main(argv: list[str] | None = None) -> Path:
    args = parse_args(build_args, __doc__.split("\n")[0], argv).finalize()
    output = check_output_path(args.output, inputs=[args.base_model, args.policy, args.task.query_dataset])
    session = LabelSession.resume(output, args.session_flags())  # checked and locked, or None: a new session
    server = LabelServer(args.host, args.port)  # a port in use ends here, before anything is sampled or written
    try:
        if session is None:
            items = sample_items(args, pick_device(args.device))
            session = LabelSession.create(output, args.session_flags(), items)
        server.show(session)
        print(f"{session.progress_line()}; each choice is saved to {output} as it is made")
        print(f"labelling page: {server.url()} ({who_can_reach(args.host)}); Ctrl-C stops it", flush=True)
        try:
            server.serve_forever(poll_interval=0.2)
        except (KeyboardInterrupt, Interrupted):
            print(f"stopped: {session.progress_line()}; run the same command to continue", flush=True)
    finally:
        server.server_close()
        if session is not None:
            session.close()
    return output


def cli() -> None:
    """The console script lmhp-label (pyproject.toml), as `python -m lm_human_preference_details.label`."""
    run_main(main)


if __name__ == "__main__":
    cli()
