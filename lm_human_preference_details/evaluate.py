"""Compare policies as the paper judged them: blind pairs of responses, K labellers an item, the majority deciding.

Win rates with 95% intervals over items, on the same held-out queries for every policy (docs/evaluation.md).

    python -m lm_human_preference_details.evaluate --task offline --policies RUN/policy zero-shot --labeller gold
    python -m lm_human_preference_details.evaluate --task sentiment --policies RUN/policy zero-shot --labeller page

Every policy samples the same held-out queries with the same seed (FIDELITY C1 plain sampling, E2 truncate and score:
the responses truncated as PPO scores them, as sample.py and the label tool show them). Each pair of policies gives
one item per query, its two responses in an order drawn at random and recorded. The labellers are people on the
labelling page (each under their name), a program (`--labeller command`, the `ID BEST` protocol of the online
collection) or the task's gold scorer. Each label is journaled as it is given: the same command continues a stopped
evaluation. OUTPUT_DIR gets comparisons.json (the labels, in the label tool's schema), results.json, win_rates.png and
dataset/ (the comparisons as a Hugging Face dataset).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Optional

import tyro

from lm_human_preference_details.cli.parsing import parse_args
from lm_human_preference_details.evaluation import judges, results
from lm_human_preference_details.evaluation.items import ZERO_SHOT, blind_items, model_of, responses_of
from lm_human_preference_details.evaluation.rouge import format_table, rouge_table
from lm_human_preference_details.labelling.server import LabelServer
from lm_human_preference_details.labelling.session import LabelSession
from lm_human_preference_details.language.tokenizer import load_tokenizer
from lm_human_preference_details.language.trained_models import check_policy_path, resolve_policy
from lm_human_preference_details.online.labellers import program_name
from lm_human_preference_details.ranks.devices import pick_device
from lm_human_preference_details.ranks.emulated import check_seed
from lm_human_preference_details.run.directory import RunDirectory, check_run_dir, read_marker
from lm_human_preference_details.tasks import TaskHParams, get_task, positions_needed
from lm_human_preference_details.utils.checks import check_at_least, check_output_dir, expand_home
from lm_human_preference_details.utils.errors import UserError, run_main

KIND = "evaluate"  # the output directory's kind (run/directory.py)
COMPARISONS = "comparisons.json"  # the labels: the label tool's session file, two samples an item


@dataclass
class Args:
    policies: list[str] = field(default_factory=list)
    """two or more policies to compare: RUN/policy saved by train_policy.py, oai:NAME (OpenAI's released run), a
    Hugging Face model, or zero-shot (the task's base model, as PPO starts from it)"""
    labeller: Literal["page", "command", "gold"] = "page"
    """who labels: page (people on a local page, each under their name), command (--command, a program) or gold (the
    task's gold scorer: the offline task)"""
    labels_per_item: int = 3
    """K: labels an item gets, each from another labeller; the majority decides (paper: a majority of three)"""
    num_queries: int = 100
    """held-out queries; each pair of policies gives one item per query"""
    seed: int = 1
    """seed of the query order, of the sampling draws (the same for every policy) and of the left/right order"""
    query_mode: Literal["auto", "test", "train"] = "auto"
    """which queries: test (held out), train, or auto: test where the source has a test split (as sample.py)"""
    command: Optional[str] = None
    """--labeller command: the program, started once; one JSON request a line on its input, `ID BEST` (0 the first
    response, 1 the second) or `ID skip` a line on its output (docs/online.md's protocol)"""
    command_name: Optional[str] = None
    """the labeller name of --command's labels (default: its program's file name), NAME#1..NAME#K"""
    timeout: float = 600.0
    """seconds --command may take to answer one request"""
    host: str = "127.0.0.1"
    """--labeller page: the address the page is served on; anything but a loopback address lets other machines label"""
    port: int = 8765
    """--labeller page: TCP port of the page (0: any free port)"""
    device: str = "auto"
    """torch device for sampling: auto (cuda if available), cpu, cuda ..."""
    output_dir: Optional[str] = None
    """where the labels and results go (default runs/evaluate_<task>_seed<seed>): a new or empty directory, or an
    evaluation's own, which the same command continues"""
    overwrite: bool = False
    """delete the evaluation in --output-dir and start again"""
    rouge: bool = False
    """also the ROUGE table (tldr, cnndm): each policy's ROUGE-1/2/L F1 against the reference summaries, with lead-3
    and the reference as rows; needs a query dataset with references (tldr-17, tldr-2019, cnndm)"""
    task: TaskHParams = field(default_factory=TaskHParams)
    """query processing, response length, temperature, truncation (preset from --task; every field overridable)"""
    base_model: str = "gpt2"
    """the model zero-shot names (the task's initial policy)"""
    task_name: tyro.conf.Suppress[str] = "sentiment"

    def finalize(self) -> "Args":
        """One-line errors for bad flags, before anything is loaded, sampled or written."""
        if len(self.policies) < 2:
            raise UserError(f"--policies names {len(self.policies)} polic{'y' if len(self.policies) == 1 else 'ies'}; "
                            "pass two or more to compare, e.g. --policies RUN/policy zero-shot")
        if len(set(self.policies)) != len(self.policies):
            raise UserError(f"--policies names a policy twice ({' '.join(self.policies)}); pass each once")
        check_at_least("--labels-per-item", self.labels_per_item, 1, "labels an item gets")
        check_at_least("--num-queries", self.num_queries, 1, "held-out queries")
        check_seed(self.seed, 1)
        if self.labeller == "command" and not (self.command or "").strip():
            raise UserError("--labeller command needs --command, the program that labels")
        if not (math.isfinite(self.timeout) and self.timeout > 0):
            raise UserError(f"--timeout is {self.timeout}; pass a number of seconds > 0")
        task = get_task(self.task_name)
        if self.labeller == "gold" and not hasattr(task, "gold_scores"):
            raise UserError(f"--labeller gold needs a task with a gold scorer, and --task {self.task_name} has none; "
                            "pass --task offline, or --labeller page or command")
        if self.query_mode == "auto":
            self.query_mode = self.task.source.heldout_mode()
        self.task.source.check_mode(self.query_mode)
        if self.query_mode == "test" and task.heldout_query_dataset and self.task.query_dataset == task.task.query_dataset:
            self.task = dataclasses.replace(self.task, query_dataset=task.heldout_query_dataset)  # the offline task's
        self.task = self.task.resolved()
        if self.rouge and not self.task.source.gives_references():
            raise UserError(f"--rouge needs reference summaries, and query dataset {self.task.query_dataset} has none; "
                            "pass a summarisation task (--task tldr or cnndm), or leave out --rouge")
        self.policies = [expand_home(p) for p in self.policies]
        for policy in self.policies:
            if policy != ZERO_SHOT:
                check_policy_path("--policies", policy, None, positions_needed(self.task))
        self.output_dir = expand_home(self.output_dir or f"runs/evaluate_{self.task_name}_seed{self.seed}")
        check_output_dir(self.output_dir)
        check_run_dir(self.output_dir, KIND, resume=is_evaluation(self.output_dir), overwrite=self.overwrite,
                      inputs=self.inputs())
        return self

    def inputs(self) -> list[str]:
        return [model_of(p, self.base_model) for p in self.policies] + [self.task.query_dataset]

    def session_flags(self) -> dict:
        """What fixes an evaluation's items and labels: the same command continues it, another is refused."""
        return {"task_name": self.task_name, "task": dataclasses.asdict(self.task), "policies": self.policies,
                "models": [model_of(p, self.base_model) for p in self.policies], "num_queries": self.num_queries,
                "seed": self.seed, "query_mode": self.query_mode, "labeller": self.labeller,
                "labels_per_item": self.labels_per_item, "repeat_share": 1.0, "train_on": "majority",
                "samples_per_item": 2, "rouge": self.rouge}


def build_args(task_name: str) -> Args:
    """The defaults of the `--task` preset."""
    task = get_task(task_name)
    return Args(task=task.task, base_model=task.base_model, task_name=task_name)


def is_evaluation(output_dir: str) -> bool:
    """Whether ``output_dir`` holds an evaluation of this command (its marker): the same command continues it."""
    marker = read_marker(Path(output_dir))
    return marker is not None and marker["kind"] == KIND


def claim_output(args: Args) -> RunDirectory:
    """The output directory, checked, locked and marked ours by the run directories' rules (docs/runs.md): a new or
    empty directory, an evaluation of ours (continued), or one with --overwrite (its entries deleted); else one line."""
    directory = RunDirectory(args.output_dir, KIND, resume=is_evaluation(args.output_dir) and not args.overwrite,
                             overwrite=args.overwrite, inputs=args.inputs(), say=print)
    directory.enter()
    return directory


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(build_args, __doc__.split("\n")[0], argv).finalize()
    get_task(args.task_name).prepare()
    server = LabelServer(args.host, args.port) if args.labeller == "page" else None  # a port in use ends here
    directory = claim_output(args)
    session = None
    try:
        output = Path(args.output_dir) / COMPARISONS
        session = LabelSession.resume(output, args.session_flags())  # a stopped evaluation, checked and locked
        if session is None:
            queries, texts, responses, tokenizer = responses_of(args.policies, args.base_model, args.task,
                                                                num_queries=args.num_queries, seed=args.seed,
                                                                mode=args.query_mode, device=pick_device(args.device))
            items = blind_items(args.policies, queries, responses, tokenizer, args.task, args.seed,
                                texts if args.rouge else None)
            session = LabelSession.create(output, args.session_flags(), items)
        complete = label(args, session, server)
        return report(args, session, complete)
    except BaseException:
        if session is None:
            directory.remove_if_empty()
        raise
    finally:
        if session is not None:
            session.close()
        if server is not None:
            server.server_close()
        directory.lock.release()


def label(args: Args, session: LabelSession, server: Optional[LabelServer]) -> bool:
    """The labels the items still want, from --labeller -> whether every item has its labels."""
    if args.labeller == "page":
        return judges.label_on_page(session, server, args.host)
    tokenizer = load_tokenizer(resolve_policy(model_of(args.policies[0], args.base_model)))
    if args.labeller == "gold":
        answer, name, program = judges.gold_answer(get_task(args.task_name).gold_scores, tokenizer), "gold", None
    else:
        name = args.command_name or program_name(args.command)
        answer, program = judges.command_answer(args.command, tokenizer, args.timeout, name)
    try:
        judges.label_by_program(session, judges.names(name, args.labels_per_item), answer)
    finally:
        if program is not None:
            program.close()
    return True


def report(args: Args, session: LabelSession, complete: bool) -> dict:
    """Print the table and write results.json, win_rates.png and dataset/ from the session's labels."""
    items = [{**item, "labels": session.decisions.labels.get(i, [])} for i, item in enumerate(session.items)]
    pairs = results.figures(args.policies, items)
    found = {"task": args.task_name, "policies": args.policies, "labeller": args.labeller,
             "labels_per_item": args.labels_per_item, "num_queries": args.num_queries, "seed": args.seed,
             "complete": complete, "pairs": pairs}
    out = Path(args.output_dir)
    if args.rouge:
        found["rouge"] = rouge_of(args.policies, session.items)
    print(results.table(pairs, args.labels_per_item))
    results.write_json(out / "results.json", found)
    results.draw(pairs, out / "win_rates.png")
    results.export_dataset(items, args.task_name, args.policies, out / "dataset")
    print(f"wrote {out / 'results.json'}, {out / 'win_rates.png'} and the comparisons as a dataset in {out / 'dataset'}")
    return found


def rouge_of(policies: list[str], items: list[dict]) -> dict:
    """The ROUGE table of the policies' responses (as the items show them) over the queries with a reference, printed
    -> {"queries": n, "rows": {row: {metric: F1}}}."""
    response, article, reference = {}, {}, {}
    for item in items:
        i = item["query_index"]
        for policy, text in zip(item["policies"], item["sample_texts"]):
            response[policy, i] = text
        article[i], reference[i] = item["article"], item["reference"]
    kept = sorted(i for i, ref in reference.items() if ref)
    if not kept:
        raise UserError("no query of this evaluation has a reference summary, so there is no ROUGE table; leave out "
                        "--rouge")
    rows = rouge_table({p: [response[p, i] for i in kept] for p in policies}, [article[i] for i in kept],
                       [reference[i] for i in kept])
    print(f"ROUGE on the {len(kept)} queries with a reference summary (rouge-score, stemmed):")
    print(format_table(rows))
    return {"queries": len(kept), "rows": rows}


def cli() -> None:
    """`python -m lm_human_preference_details.evaluate`."""
    run_main(main)


if __name__ == "__main__":
    cli()
