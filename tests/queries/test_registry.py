"""A query source owns its kind: a new kind is one class and one registry line, and what a source cannot
take (a start text, a mode) is one `error:` line when the flags are checked, before any model, download or process
group."""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch
from helpers.errors import one_error_line

from lm_human_preference_details import tasks
from lm_human_preference_details.queries import make_query_sampler
from lm_human_preference_details.queries.batches import RankBatches
from lm_human_preference_details.queries.registry import SOURCES
from lm_human_preference_details.queries.source import QuerySource
from lm_human_preference_details.tasks import TaskHParams, check_task_inputs
from lm_human_preference_details.utils.errors import UserError


class CountingBatches(RankBatches):
    """Rank r's k-th query of length q is [1000 * r + k] * q: which rank and which draw, readable in every token."""

    def __init__(self, **sizes):
        super().__init__(**sizes)
        self.drawn = 0

    def __next__(self) -> torch.Tensor:
        b, k = self.rank_batch_size, self.drawn
        self.drawn += b
        rows = [[1000 * r + k + i] * self.query_length for r in self.ranks for i in range(b)]
        return torch.tensor(rows, dtype=torch.long)  # [len(ranks) * b, query_length]


@dataclass(frozen=True)
class Counting(QuerySource):
    """A toy kind of source, neither of the two pipelines: its own modes, its own start-text rule, its own batches."""

    modes: ClassVar[tuple[str, ...]] = ("train",)

    def check_processing(self, start_text, end_text) -> None:
        if start_text is not None:
            raise UserError(f"query dataset {self.name} takes no start text")

    def batches(self, tokenizer, request, *, batch_size, num_ranks, ranks):
        return CountingBatches(batch_size=batch_size, query_length=request.query_length, num_ranks=num_ranks,
                               ranks=ranks)


def test_a_new_kind_is_one_class_and_one_registry_line(tokenizer, monkeypatch):
    monkeypatch.setitem(SOURCES, "counting", Counting())  # the one line
    task = TaskHParams(query_dataset="counting", query_length=3).resolved()
    assert isinstance(task.source, Counting) and task.source.name == "counting"
    sampler = make_query_sampler(tokenizer, task, batch_size=4, seed=0, num_ranks=2, ranks=[1])
    assert next(sampler).tolist() == [[1000, 1000, 1000], [1001, 1001, 1001]]
    assert next(sampler).tolist() == [[1002, 1002, 1002], [1003, 1003, 1003]]
    assert sampler.batches_drawn == 2  # the resumable wrapper every source gets
    with pytest.raises(UserError, match="query dataset counting takes no start text"):
        TaskHParams(query_dataset="counting", start_text=".").resolved()  # the kind's rule, asked at flag time
    with pytest.raises(UserError, match="query mode must be 'train', got 'test'"):
        task.source.check_mode("test")


def test_the_task_decides_its_source_once_and_its_config_keeps_the_name(tokenizer, tiny_model_dir, tmp_path,
                                                                       monkeypatch):
    path = tmp_path / "q.txt"
    path.write_text("Intro. A cat sat. Tail\n\nIntro. A dog ran. Tail")
    calls, real = [], tasks.query_source
    monkeypatch.setattr(tasks, "query_source", lambda name: calls.append(name) or real(name))
    task = TaskHParams(query_dataset=str(path), query_length=8).resolved()  # as every script's finalize does
    check_task_inputs(task, str(tiny_model_dir))  # the flag checks
    next(make_query_sampler(tokenizer, task, batch_size=2, seed=0, num_ranks=1))  # the run
    assert calls == [str(path)]  # decided once, then the object is handed down
    config = dataclasses.asdict(task)  # what config.json, checkpoints and W&B hold: the name, no object
    assert config == dataclasses.asdict(TaskHParams(query_dataset=str(path), query_length=8, start_text=".",
                                                    end_text="."))
    assert json.loads(json.dumps(config))["query_dataset"] == str(path)


# ------------------------------------------------------------------------ late flags, now checked with the flags
HEAVY = ("load_lm", "load_model_dir", "load_policy", "base_model_config", "fetch", "fetch_oai", "fetch_many",
         "hf_hub_download", "snapshot_download", "export_files", "hub_archive")


@pytest.fixture()
def nothing_heavy(monkeypatch):
    """Every model loader, download and process-group join of the package and the scripts fails the test if called,
    wherever a module took it by name."""

    def heavy(*args, **kwargs):
        raise AssertionError("a model, a download or a process group came before the flag's error line")

    for name, module in list(sys.modules.items()):
        if module is not None and (name.startswith("lm_human_preference_details") or name.startswith("train_")):
            for attr in HEAVY:
                if callable(getattr(module, attr, None)):
                    monkeypatch.setattr(module, attr, heavy)
    monkeypatch.setattr(torch.distributed, "init_process_group", heavy)


def test_a_start_text_with_a_baseline_source_is_refused_before_the_reward_models_load(assets, tmp_path, capsys,
                                                                                      monkeypatch, nothing_heavy):
    import train_reward

    monkeypatch.chdir(tmp_path)
    argv = ["--base-model", assets / "tiny-gpt2", "--labels.source", assets / "labels.json", "--labels.num-train", 64,
            "--batch-size", 16, "--task.query-dataset", "bookcorpus", "--task.start-text", ".",
            "--rollout-batch-size", 64, "--normalize-samples", 64, "--eval-labels", 32, "--output-dir", tmp_path / "run",
            "--device", "cpu"]
    line = one_error_line(capsys, train_reward.main, argv)
    assert line == ("error: the baseline's Hugging Face query streams use no start/end text (fork commit cbdfd00); "
                    "set --task.start-text and --task.end-text to None")
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_query_mode_test_on_bookcorpus_is_refused_before_any_policy_is_read(assets, tmp_path, capsys, monkeypatch,
                                                                            nothing_heavy):
    from lm_human_preference_details import sample

    monkeypatch.chdir(tmp_path)
    argv = ["--policy", assets / "tiny-gpt2", "--task.query-dataset", "bookcorpus", "--query-mode", "test",
            "--output-dir", tmp_path / "out", "--device", "cpu"]
    line = one_error_line(capsys, sample.main, argv)
    assert line == ("error: query dataset bookcorpus has only a train split (the baseline never read another); use the "
                    "train split (sample.py --query-mode train) or books-2019 for held-out queries")
    assert list(tmp_path.iterdir()) == []


def test_hub_datasets_name_the_hub_sources_of_a_runs_queries():
    from lm_human_preference_details.queries.registry import hub_datasets

    def of(name):
        return hub_datasets({"task": {"query_dataset": name}})

    assert of("bookcorpus") == ["bookcorpus/bookcorpus"] and of("tldr-17") == ["webis/tldr-17"]
    assert of("books-2019") == of("cnndm") == of("/data/my_queries.jsonl") == [] and hub_datasets({}) == []
