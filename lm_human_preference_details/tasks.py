"""Tasks: the original's four presets (OAI launch.py, every number with its source), the names `--task` takes.

A `Task` is a preset (the defaults of both scripts' arguments) plus three hooks that the original's tasks leave
empty: `prepare` (build local assets), `extra_stats` (metrics of a PPO update beyond the original's) and `report`
(an end-of-run summary). The offline demo is the one task that uses them; it is found by module name,
so the core never imports it.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from dataclasses import dataclass
from typing import Annotated, Callable, Optional

import tyro

from lm_human_preference_details.language.model_files import base_model_config, check_lm_config
from lm_human_preference_details.queries.registry import check_query_dataset, query_source
from lm_human_preference_details.queries.source import QuerySource
from lm_human_preference_details.utils.checks import check_at_least, check_positive, expand_home
from lm_human_preference_details.utils.downloads import OAI_URL
from lm_human_preference_details.utils.errors import UserError

# start_text / end_text left to the query dataset: a dataset name carries its processing (several tokens, so it can
# never be a real one-token start or end text)
DATASET_DEFAULT = "<the query dataset's>"
FROM_DATASET = tyro.conf.arg(help_behavior_hint="(default: the query dataset's)")  # --help shows it unquoted


@dataclass
class TaskHParams:
    """What a query and a response are (OAI lm_tasks.py: TaskHParams)."""

    query_length: int = 64
    """tokens per query after processing (launch.py books_task: 64)"""
    query_dataset: str = "bookcorpus"
    """where the queries come from (launch.py: books, tldr, cnndm; the baseline's fork: bookcorpus, tldr-17):
    bookcorpus or tldr-17, the public baseline's Hugging Face streams, a shuffle per rank;
    books-2019, tldr-2019, cnndm or oai-label-queries, the 2019 pipeline of OpenAI's files, one shuffle;
    or a local .parquet file or folder, corpus-webis-tldr-17.zip, or .jsonl/.txt path (docs/data-sources.md)."""
    query_column: str = "text"
    """the text column of a parquet query dataset, or the field of tldr-17's corpus;
    the fork reads `text` of bookcorpus and `body` of webis/tldr-17 (the tldr preset's)"""
    query_prefix: str = ""
    """text put before every query (launch.py: '' for books, 'Article:\\n\\n' for cnndm)"""
    query_suffix: str = ""
    """text put after every query (launch.py: '\\n\\nTL;DR:' for tldr and cnndm)"""
    start_text: Annotated[Optional[str], FROM_DATASET] = DATASET_DEFAULT
    """queries start right after the first occurrence of this one-token text; None to keep the start;
    the query dataset's by default: '.' for books-2019 and local .jsonl/.txt as launch.py, None for bookcorpus as the fork"""
    end_text: Annotated[Optional[str], FROM_DATASET] = DATASET_DEFAULT
    """queries end with the last occurrence of this one-token text; None to keep the end;
    the query dataset's by default: '.' for books-2019 and local .jsonl/.txt as launch.py, None for bookcorpus as the fork"""
    response_length: int = 24
    """tokens sampled per response, always exactly this many (launch.py: 24 books, 75 tldr/cnndm)"""
    truncate_token: Optional[int] = 13
    """responses are cut after the first of this token at index >= truncate_after; None: never (launch.py: 13 '.')"""
    truncate_after: int = 16
    """first response index at which truncate_token counts (launch.py: 16 books, 55 tldr/cnndm)"""
    penalty_reward_value: float = -1.0
    """score of a response with no truncate_token at or after truncate_after (launch.py: -1)"""
    temperature: float = 0.7
    """sampling temperature of the policy (launch.py: 0.7, cnndm 0.5)"""

    @property
    def source(self) -> QuerySource:
        """The query source --task.query-dataset names (its ``~`` expanded), decided once (`registry.query_source`,
        called here alone) and kept with the task. Not a field: the name stays what tyro, config.json, checkpoints and
        W&B hold."""
        name, source = self.__dict__.get("_source", (None, None))
        if name != self.query_dataset:  # not yet decided, or the value was set again since
            name, source = self.query_dataset, query_source(expand_home(self.query_dataset))
            self._source = name, source
        return source

    def resolved(self) -> TaskHParams:
        """A copy whose start and end text left at DATASET_DEFAULT take the query dataset's own (its QuerySource's),
        and whose query dataset path has its ``~`` expanded once (cli.expand_home); the source refuses a start or end
        text it cannot take here, when the flags are checked (`QuerySource.check_processing`)."""
        source = self.source
        start = source.start_text if self.start_text == DATASET_DEFAULT else self.start_text
        end = source.end_text if self.end_text == DATASET_DEFAULT else self.end_text
        source.check_processing(start, end)
        task = dataclasses.replace(self, query_dataset=expand_home(self.query_dataset), start_text=start, end_text=end)
        task._source = task.query_dataset, source
        return task


def check_task(task: TaskHParams) -> None:
    """The task's own numbers, checked before anything loads: positive lengths, temperature > 0, truncation that can
    happen inside a response. Each failure is one line naming the flag."""
    check_at_least("--task.query-length", task.query_length, 1, "tokens per query")
    check_at_least("--task.response-length", task.response_length, 1, "tokens per response")
    check_positive("--task.temperature", task.temperature, "the sampling temperature (logits are divided by it)")
    check_at_least("--task.truncate-after", task.truncate_after, 0, "a response index")
    if task.truncate_token is not None:
        check_at_least("--task.truncate-token", task.truncate_token, 0, "a token id")
    if not math.isfinite(task.penalty_reward_value):
        raise UserError(f"--task.penalty-reward-value is {task.penalty_reward_value}; pass a finite score (launch.py: -1)")
    if task.truncate_token is not None and task.truncate_after >= task.response_length:
        raise UserError(f"--task.truncate-after ({task.truncate_after}) must be below --task.response-length "
                        f"({task.response_length}), else every response is rejected; lower --task.truncate-after")


def check_task_inputs(task: TaskHParams, base_model: str, labels_source: str | None = None) -> None:
    """What the task's flags name on disk or on the hub, read without loading a model: the base model (its files, or
    its hub config), the query file (its format and texts, and one usable query with the task's start and end text;
    for oai-label-queries, ``labels_source``'s queries), a truncate token in its vocabulary and room in its context
    for prefix + query + suffix + response."""
    task = task.resolved()
    config = base_model_config(base_model)  # first: the query file's check encodes texts with its tokenizer
    check_lm_config(config, f"--base-model {base_model}", *positions_needed(task))
    check_query_dataset(task.source, query_length=task.query_length, labels_source=labels_source,
                        column=task.query_column, start_text=task.start_text, end_text=task.end_text,
                        base_model=base_model)
    n_vocab = config.get("vocab_size")
    if task.truncate_token is not None and n_vocab is not None and task.truncate_token >= n_vocab:
        raise UserError(f"--task.truncate-token is {task.truncate_token}, but --base-model {base_model} has {n_vocab} "
                        f"tokens, so no response would ever hold it; pass a token id below {n_vocab} (13 is '.') or None")


def positions_needed(task: TaskHParams) -> tuple[int, str]:
    """The positions a query and its response take at most, and the flags that make them up (model_files.check_lm_config)."""
    # byte-level BPE: a text never takes more tokens than it has bytes
    extra = len(task.query_prefix.encode()) + len(task.query_suffix.encode())
    needed = task.query_length + task.response_length + extra
    return needed, (f"--task.query-length ({task.query_length}) + --task.response-length ({task.response_length})"
                    f"{f' + up to {extra} prefix/suffix tokens' if extra else ''}")


@dataclass
class LabelHParams:
    """Where the human labels come from (OAI train_reward.py: LabelHParams)."""

    type: str = "best_of_4"
    """label type; the released files are all best_of_4 (launch.py)"""
    num_train: int = 4992
    """labels used for training, one epoch (launch.py: 4992 books, 46000 tldr/cnndm)"""
    source: str = f"{OAI_URL}/labels/sentiment/offline_5k.json"
    """URL or local path of a label file in OpenAI's schema (launch.py)"""

    def resolved(self) -> LabelHParams:
        """A copy whose source path has its ``~`` expanded once (cli.expand_home)."""
        return dataclasses.replace(self, source=expand_home(self.source))


def check_labels(labels: LabelHParams) -> int:
    """The labels' own values, checked before anything loads: a positive count, a best_of_N type -> N, parsed here
    only. Each failure is one line naming the flag (as train_reward.py takes it)."""
    check_at_least("--labels.num-train", labels.num_train, 1, "the number of labels trained on")
    n = labels.type.removeprefix("best_of_")
    if not labels.type.startswith("best_of_") or not n.isdigit() or int(n) < 2:
        raise UserError(f"labels.type {labels.type!r} is not supported; use best_of_N, N >= 2 (e.g. best_of_4)")
    return int(n)


@dataclass
class Task:
    """A task's defaults for both scripts, and the hooks a task may add to a run (none for the original's four)."""

    task: TaskHParams
    labels: LabelHParams
    train_reward: dict
    """train_reward.py's own fields (batch_size, lr, rollout_batch_size, normalize_samples, ...)"""
    ppo: dict
    """train_policy.py's PpoHParams fields"""
    rewards: dict
    """train_policy.py's RewardHParams fields (the KL penalty)"""
    base_model: str = "gpt2"
    run: dict = dataclasses.field(default_factory=dict)
    """RunArgs defaults of both scripts (the offline demo: --exact-ranks)"""
    online: dict = dataclasses.field(default_factory=dict)
    """train_policy.py's OnlineHParams fields (empty: online collection off; offline-online: the offline demo online)"""
    heldout_query_dataset: Optional[str] = None
    """a local query file held out for evaluation, when the task's corpus is local (the original's datasets have modes)"""
    gpu_sized: bool = True
    """a run takes days on a CPU (GPT-2 124M and up): --device auto refuses to fall back to the CPU (devices.pick_device)"""

    def prepare(self) -> None:
        """Make the local assets the task needs, once (the original's tasks download theirs as they go)."""

    def extra_stats(self, tokenizer, data: dict) -> dict[str, float]:
        """Metrics of one PPO update beyond the original's, from its rollout ``data``."""
        return {}

    def report(self, args, tokenizer, policy, ref_policy, reward_model, reward_results: dict) -> Optional[dict]:
        """An end-of-run summary of a policy run, after the policy is saved."""
        return None


def _books(labels: str) -> Task:
    return Task(
        task=TaskHParams(),
        labels=LabelHParams(num_train=4992, source=f"{OAI_URL}/labels/{labels}"),
        train_reward={"batch_size": 32, "lr": 5e-5, "rollout_batch_size": 512, "normalize_samples": 256},
        ppo={"total_episodes": 1_000_000, "batch_size": 512, "lr": 1e-5, "whiten_rewards": True},
        rewards={"kl_coef": 0.15, "adaptive_kl": True, "target": 6.0, "horizon": 10000},
    )


def _summaries(name: str, dataset: str, column: str, prefix: str, end_text: Optional[str], temperature: float,
               kl_coef: float) -> Task:
    return Task(
        task=TaskHParams(
            query_length=500, query_dataset=dataset, query_column=column, query_prefix=prefix, query_suffix="\n\nTL;DR:",
            start_text=None, end_text=end_text, response_length=75, truncate_token=198, truncate_after=55,
            temperature=temperature,
        ),
        labels=LabelHParams(num_train=46000, source=f"{OAI_URL}/labels/{name}/online_45k.json"),
        train_reward={"batch_size": 16, "lr": 2.5e-5, "rollout_batch_size": 128, "normalize_samples": 256},
        # DEVIATION: launch.py writes `rewards.whiten False`, a field that does not exist; read as ppo.whiten_rewards = False
        # (32 episodes / 8 ranks = 4 per rank is also below the whitening minimum of 8).
        ppo={"total_episodes": 1_000_000, "batch_size": 32, "lr": 2e-6, "whiten_rewards": False},
        rewards={"kl_coef": kl_coef, "adaptive_kl": False, "target": 6.0, "horizon": 10000},
    )


# OAI launch.py: books_task, summarize_task and the four experiments; the query sources of the public baseline's
# fork (vwxyzjn/lm-human-preferences, branch poetry): HF bookcorpus (commit cbdfd00) and webis/tldr-17
PRESETS: dict[str, Callable[[], Task]] = {
    "sentiment": lambda: _books("sentiment/offline_5k.json"),
    "descriptiveness": lambda: _books("descriptiveness/offline_5k.json"),
    "tldr": lambda: _summaries("tldr", "tldr-17", "body", "", None, 0.7, 0.03),  # tldr-2019: OpenAI's subset files
    "cnndm": lambda: _summaries("cnndm", "cnndm", "text", "Article:\n\n", "\n", 0.5, 0.01),
}
# Tasks that are not in the original, as "module:function" with the function -> Task (README: the offline task;
# docs/online.md: the offline task online)
EXTRA_TASKS: dict[str, str] = {"offline": "lm_human_preference_details.offline.task:task",
                               "offline-online": "lm_human_preference_details.offline.task:online_task"}
TASK_NAMES = (*PRESETS, *EXTRA_TASKS)


def get_task(name: str) -> Task:
    """A fresh copy of task ``name`` (building defaults never mutates a preset)."""
    if name in PRESETS:
        return PRESETS[name]()
    if name in EXTRA_TASKS:
        # loaded by name, never imported: the package stays free of the offline demo (tests/repository/test_layout.py)
        module, function = EXTRA_TASKS[name].split(":")
        return getattr(importlib.import_module(module), function)()
    raise UserError(f"unknown --task {name!r}; choose one of {', '.join(TASK_NAMES)}")
