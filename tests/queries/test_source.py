"""queries/source.py: a source is one function and one registry line; its kind is decided once, in queries/; the
subpackage's modules stay small, import downwards only, and are each entered once from the flag to a batch."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lm_human_preference_details.queries import make_query_sampler, query_source
from lm_human_preference_details.queries.registry import SOURCES, check_query_dataset
from lm_human_preference_details.queries.samplers import TextSource
from lm_human_preference_details.queries.streams import seeded_shuffle
from lm_human_preference_details.tasks import TaskHParams

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "lm_human_preference_details"
QUERIES = PACKAGE / "queries"
GREETINGS = [f"Hello number {i}. How are you today? Fine." for i in range(10)]


def greetings(request):
    """The toy source of docs/data-sources.md: one pass in the order `random.seed(seed); random.shuffle` gives."""
    return seeded_shuffle(GREETINGS, request.seed)


@pytest.fixture()
def toy_source(monkeypatch):
    monkeypatch.setitem(SOURCES, "greetings", TextSource(items=greetings, start_text=".", end_text="."))


def test_a_registered_toy_source_is_sampled_like_every_2019_source(tokenizer, toy_source):
    task = TaskHParams(query_dataset="greetings", query_length=12).resolved()
    assert (task.start_text, task.end_text) == (".", ".")  # the source's own defaults (A4)
    check_query_dataset(task.source, query_length=12, labels_source=None)  # known to the checks too
    sampler = make_query_sampler(tokenizer, task, batch_size=4, seed=1, num_ranks=2)
    batches = torch.cat([next(sampler) for _ in range(3)])  # [12, 12]: 12 items of a 10-text source, repeated
    # naive: one seed-0 shuffle, each text cut after its first '.' and up to its last '.', right-padded;
    # the stream repeated and item j of each batch of 4 going to rank j % 2, rank blocks side by side
    stream = [tokenizer.encode(t.split(".", 1)[1]) for t in seeded_shuffle(GREETINGS, 0)] * 2
    padded = [ids + [tokenizer.pad_token_id] * (12 - len(ids)) for ids in stream]
    expected = [padded[k + j] for k in range(0, 12, 4) for j in (0, 2, 1, 3)]
    assert batches.tolist() == expected
    assert tokenizer.decode(stream[0]) == " How are you today? Fine."


def test_the_kind_of_each_value_is_decided_by_query_source(tmp_path):
    folder = tmp_path / "folder"
    folder.mkdir()
    pq.write_table(pa.table({"text": ["a"]}), folder / "train.parquet")
    kinds = {name: (type(query_source(name)).__name__, query_source(name).modes, query_source(name).start_text)
             for name in ("bookcorpus", "tldr-17", "books-2019", "cnndm", "q.txt", "q.jsonl", "x.parquet", "c.zip",
                          str(folder), "missing-name")}
    per_rank, text = ("ColumnSource", ("train",), None), ("TextSource", ("train", "test"), None)
    assert kinds == {"bookcorpus": per_rank, "tldr-17": per_rank, "books-2019": (*text[:2], "."), "cnndm": text,
                     "q.txt": (*text[:2], "."), "q.jsonl": (*text[:2], "."), "x.parquet": per_rank, "c.zip": per_rank,
                     str(folder): per_rank, "missing-name": text}
    assert query_source("~/q.txt").path == Path.home() / "q.txt"  # one path, ~ expanded, for every reader


# the tests of what a name is, which only the query-source code may make
KIND_TESTS = re.compile(r"is_hf_source|is_archive|HF_SOURCES|QUERY_DATASETS|\bDATASETS\b|dataset_start_end|"
                        r"query_dataset\s*(?:==|!=|not in|in)\s*(?:[\"'(\[{]|[A-Z_]{3,})|query_dataset[^\n]*\.suffix")


def test_no_module_outside_queries_tests_what_kind_of_source_a_name_is():
    outside = [*PACKAGE.glob("*.py"), *ROOT.glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    found = [f"{p.relative_to(ROOT)}:{i}" for p in outside
             for i, line in enumerate(p.read_text().splitlines(), 1) if KIND_TESTS.search(line)]
    assert not found, found
    assert KIND_TESTS.search('if task.query_dataset in ("bookcorpus", "tldr-17"):')  # the pattern does catch one
    assert KIND_TESTS.search("texts = task.query_dataset not in QUERY_DATASETS")
    assert not KIND_TESTS.search("if task.query_dataset == default.query_dataset:")  # a value against a value


def test_the_subpackages_modules_say_their_job():
    """Their sizes are held with the whole package's (test_layout.test_no_module_class_or_function_is_over_its_size)."""
    for path in QUERIES.glob("*.py"):
        tree = ast.parse(path.read_text())
        assert ast.get_docstring(tree), f"{path.name} says its job in a docstring"


def package_imports(path: Path) -> list[tuple[str, bool]]:
    """(module, at module top) for each import of the package in ``path``; the subpackage's modules as `queries.x`,
    a name taken from the subpackage itself as `queries.__init__`."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PACKAGE.name)):
            continue
        parts = node.module.split(".")[1:]
        if not parts:  # from lm_human_preference_details import files, queries
            names = [a.name for a in node.names]
        elif parts == ["queries"]:  # from lm_human_preference_details.queries import registry, make_query_sampler
            names = [f"queries.{a.name}" if (QUERIES / f"{a.name}.py").exists() else "queries.__init__"
                     for a in node.names]
        else:
            names = [".".join(parts[:2]) if parts[0] == "queries" else parts[0]]
        found += [(name, id(node) in top) for name in names]
    return found


def import_graph() -> dict[str, set[str]]:
    """Package module -> package modules it imports; the subpackage's modules as `queries.x`."""
    paths = {p.stem: p for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    paths.update({f"queries.{p.stem}": p for p in QUERIES.glob("*.py")})
    return {name: {m for m, _ in package_imports(path) if m in paths} for name, path in paths.items()}


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_the_subpackage_imports_downwards_only_and_at_module_top():
    graph = import_graph()
    queries = {m for m in graph if m.startswith("queries.")}
    # really read: the registry's lines are made of the kinds, each defined beside its sampler
    assert graph["queries.registry"] >= {"queries.samplers"}
    assert graph["queries.samplers"] >= {"queries.source", "queries.batches", "queries.streams"}
    assert "queries.__init__" in graph["sample"] and "queries.registry" in graph["tasks"]
    for module in queries:
        assert module not in reachable(graph, module), f"{module} is part of an import cycle"
        below = reachable(graph, module) - queries
        assert not any(m in queries or reachable(graph, m) & queries for m in below), f"{module} imports upwards"
    for path in QUERIES.glob("*.py"):
        inner = [m for m, top in package_imports(path) if not top]
        assert not inner, f"{path.name} imports {inner} inside a function"


def test_following_the_flag_to_a_batch_enters_each_module_once(tokenizer, tmp_path):
    """Trace every call of the package from `--task.query-dataset` to a batch: on any chain of calls a module,
    once left for another, is never entered again (a local parquet and a local text file; checks included)."""
    pq.write_table(pa.table({"text": [f"row {i} of the file." for i in range(9)]}), tmp_path / "q.parquet")
    (tmp_path / "q.txt").write_text("\n\n".join(f"Intro. Passage {i} here. Tail" for i in range(9)))
    re_entered = []

    def profile(frame, event, arg):
        if event == "call":
            name = frame.f_globals.get("__name__", "")
            stack.append(name if name.startswith("lm_human_preference_details") else None)
            chain = [m for i, m in enumerate(stack) if m and (i == 0 or m != stack[i - 1])]
            chain = [m for i, m in enumerate(chain) if i == 0 or m != chain[i - 1]]
            if len(chain) != len(set(chain)):
                re_entered.append(" -> ".join(chain))
        elif event == "return" and stack:
            stack.pop()

    for dataset in (tmp_path / "q.parquet", tmp_path / "q.txt"):
        stack: list[str | None] = []
        sys.setprofile(profile)
        try:
            task = TaskHParams(query_dataset=str(dataset), query_length=6).resolved()
            check_query_dataset(task.source, query_length=6, labels_source=None, start_text=task.start_text,
                                end_text=task.end_text)
            next(make_query_sampler(tokenizer, task, batch_size=4, seed=1, num_ranks=2, shuffle_seed=0))
        finally:
            sys.setprofile(None)
    assert not re_entered, sorted(set(re_entered))[:5]


def test_the_readme_and_the_docs_show_the_subpackage():
    readme = (ROOT / "README.md").read_text()
    assert "queries/" in readme.split("## Layout", 1)[1].split("```")[1]
    docs = (ROOT / "docs" / "data-sources.md").read_text()
    example = docs.split("## Adding a query source", 1)[1].split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(example, "docs/data-sources.md", "exec"), namespace)  # the documented lines register the source
    try:
        assert isinstance(SOURCES["greetings"], TextSource)
        assert json.dumps(list(namespace["greetings"](type("R", (), {"seed": 0})()))) == json.dumps(
            seeded_shuffle(GREETINGS, 0))
    finally:
        SOURCES.pop("greetings", None)
