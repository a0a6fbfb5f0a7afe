"""evaluate.py: policies compared blind on the offline task by the gold scorer and by a program, the files it writes,
a kill -9 continued by the same command to the uninterrupted results, and bad input. The figures themselves:
evaluation/test_results.py; the page in a real browser: e2e/test_evaluate_page.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers.errors import assert_one_error_line
from helpers.evaluation import evaluate_command, happy_policy
from helpers.labelling import label_env, tiny_offline_cache
from helpers.processes import ForkedProcess, as_a_new_process, differing, refused_in_process

from lm_human_preference_details import evaluate

ROOT = Path(__file__).resolve().parents[1]
# a judge of two responses: the longer text wins, equal lengths are skipped; with a file ARMED beside it, it stops
# answering at its 5th request, says so in PAUSED (its pid) and waits to be killed
JUDGE = """
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
for n, line in enumerate(sys.stdin):
    request = json.loads(line)
    if n == 4 and os.path.exists(os.path.join(here, "ARMED")):
        open(os.path.join(here, "PAUSED"), "w").write(str(os.getpid()))
        time.sleep(600)
    left, right = map(len, request["responses"])
    print(request["id"], "skip" if left == right else 0 if left > right else 1, flush=True)
"""


@pytest.fixture(scope="module")
def cache(assets, tmp_path_factory):
    return tiny_offline_cache(tmp_path_factory.mktemp("evaluate_cache"), assets)


@pytest.fixture(scope="module")
def happy(assets, tmp_path_factory) -> Path:
    return happy_policy(assets, tmp_path_factory.mktemp("happy") / "policy")


def in_process(cache: Path, cwd: Path, argv: list) -> tuple[dict, str]:
    """evaluate.main(argv) in this process, as a fresh one on the tests' offline cache would run -> (results, stdout)."""
    with as_a_new_process({"LMHP_CACHE": cache}, cwd) as (out, _):
        found = evaluate.main([str(a) for a in argv])
    return found, out.getvalue()


def test_gold_prefers_the_better_policy_and_every_file_says_so(cache, happy, tmp_path):
    out = tmp_path / "eval"
    argv = ["--task", "offline", "--policies", happy, "zero-shot", "--labeller", "gold", "--num-queries", "16",
            "--device", "cpu", "--output-dir", out]
    found, printed = in_process(cache, tmp_path, argv)
    (pair,) = found["pairs"]
    name = str(happy)
    rate = pair["win_rate"][name]
    assert pair["items"] == 16 and rate["low"] > 0.5, pair  # the interval excludes 0.5
    assert json.loads((out / "results.json").read_text()) == found
    assert f"{rate['value'] * 100:.1f}%" in printed and "majority of 3" in printed
    records = json.loads((out / "comparisons.json").read_text())
    assert len(records) == 16 and all(len(r["labels"]) == 3 and set(r) >= {"sample0", "sample1"} for r in records)
    assert {label["labeller"] for r in records for label in r["labels"]} == {"gold#1", "gold#2", "gold#3"}
    # the order is recorded and drawn: each policy is shown on the left for some items
    header = json.loads((out / "comparisons.json.session.jsonl").read_text().splitlines()[0])
    lefts = [item["policies"][0] for item in header["items"]]
    assert set(lefts) == {name, "zero-shot"}
    import datasets

    rows = datasets.load_dataset("parquet", data_files=str(out / "dataset" / "comparisons.parquet"), split="train")
    assert len(rows) == 48 and set(rows["preferred"]) <= {name, "zero-shot"}
    assert (out / "win_rates.png").read_bytes()[:4] == b"\x89PNG"
    # the same command again continues the finished evaluation: nothing asked, the same figures; another is refused
    again, _ = in_process(cache, tmp_path, argv)
    assert again == found
    other = refused_in_process("lm_human_preference_details.evaluate", [*argv, "--seed", "2"], tmp_path,
                               {"LMHP_CACHE": cache})
    assert_one_error_line(other, "seed=1")


def test_a_kill_9_during_a_command_evaluation_continues_to_the_same_results(cache, happy, tmp_path):
    judge = tmp_path / "judge.py"
    judge.write_text(JUDGE)
    flags = ["--task", "offline", "--policies", happy, "zero-shot", "--labeller", "command", "--command",
             f"{sys.executable} {judge}", "--num-queries", "6", "--labels-per-item", "2", "--device", "cpu"]
    whole, _ = in_process(cache, tmp_path, [*flags, "--output-dir", tmp_path / "whole"])
    assert whole["pairs"][0]["labels"] > 0

    out = tmp_path / "killed"
    (tmp_path / "ARMED").write_text("")
    env = differing(label_env(cache))
    # a process of its own, killed: a fork of this one (a new interpreter would add only its imports)
    proc = ForkedProcess(*evaluate_command(*flags, "--output-dir", out)[2:], env_extra=env, cwd=tmp_path, output=False)
    try:
        deadline = time.monotonic() + 600
        while not (tmp_path / "PAUSED").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "PAUSED").exists(), "the judge was never asked a 5th time"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        if (tmp_path / "PAUSED").exists() and (pid := (tmp_path / "PAUSED").read_text()):
            os.kill(int(pid), signal.SIGKILL)  # the judge runs in a session of its own: ended by its pid
    journal = (out / "comparisons.json.session.jsonl").read_text().splitlines()
    assert len(journal) == 1 + 4  # the header and the four answers given before the kill
    assert not (out / "results.json").exists()
    (tmp_path / "ARMED").unlink()
    resumed, _ = in_process(cache, tmp_path, [*flags, "--output-dir", out])
    assert resumed == whole
    assert (out / "comparisons.json").read_bytes() == (tmp_path / "whole" / "comparisons.json").read_bytes()


REAL_CASE = ["--policies", "zero-shot"]  # run as a real `python -m ...evaluate` below


@pytest.mark.parametrize("extra, message", [
    (REAL_CASE, "--policies names 1 policy; pass two or more"),
    (["--policies", "nowhere/policy", "zero-shot"], "nowhere/policy"),
    (["--policies", "zero-shot", "zero-shot"], "names a policy twice"),
    (["--policies", "a", "zero-shot", "--labels-per-item", "0"], "--labels-per-item is 0"),
    (["--policies", "a", "zero-shot", "--labeller", "command"], "--labeller command needs --command"),
    (["--policies", "a", "zero-shot", "--rouge"], "--rouge needs reference summaries"),
], ids=["one-policy", "unknown-policy", "twice", "k-0", "no-command", "rouge-without-references"])
def test_bad_input_is_one_line_and_writes_nothing(cache, tmp_path, extra, message):
    """REAL_CASE is a real `python -m lm_human_preference_details.evaluate` (the line and status as a user gets them;
    every other test runs the command in this process or a fork of it); the rest are refused in this process."""
    argv = ["--task", "offline", "--labeller", "gold", *extra, "--output-dir", tmp_path / "out"]
    if extra is REAL_CASE:
        result = subprocess.run(evaluate_command(*argv), cwd=tmp_path, env=label_env(cache), capture_output=True,
                                text=True, timeout=600)
    else:
        result = refused_in_process("lm_human_preference_details.evaluate", argv, tmp_path, {"LMHP_CACHE": cache})
    assert_one_error_line(result, message, out=tmp_path / "out")


def test_more_queries_than_the_held_out_stream_holds_is_one_line_and_leaves_nothing(cache, happy, tmp_path):
    # the tests' held-out passages: 400, each a usable query
    result = refused_in_process("lm_human_preference_details.evaluate", [
        "--task", "offline", "--policies", happy, "zero-shot", "--labeller", "gold", "--num-queries", "500",
        "--device", "cpu", "--output-dir", tmp_path / "out"], tmp_path, {"LMHP_CACHE": cache})
    assert result.returncode == 2 and "--num-queries 500 is more than the" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_gold_on_a_task_without_a_gold_scorer_is_one_line(tmp_path):
    result = refused_in_process("lm_human_preference_details.evaluate", [
        "--task", "sentiment", "--policies", "a", "zero-shot", "--labeller", "gold"], tmp_path)
    assert result.returncode == 2 and "--labeller gold needs a task with a gold scorer" in result.stderr


def test_rouge_of_each_policy_lead_3_and_the_reference(cache, happy, assets, tmp_path, monkeypatch):
    """--rouge on a source whose texts carry references (here the tests' passages, each summarised by its first
    sentence), as tldr-2019's and cnndm's do."""
    from lm_human_preference_details.evaluation.rouge import rouge_f1
    from lm_human_preference_details.queries import registry
    from lm_human_preference_details.queries.batches import Article
    from lm_human_preference_details.queries.samplers import TextSource

    passages = (assets / "queries.txt").read_text().strip().split("\n\n")
    articles = [Article(p, p.split(". ")[0] + ".") for p in passages]
    monkeypatch.setitem(registry.SOURCES, "tldr-2019", TextSource(items=lambda r: iter(articles), references=True))
    found, printed = in_process(cache, tmp_path, [
        "--task", "offline", "--task.query-dataset", "tldr-2019", "--policies", happy, "zero-shot", "--labeller", "gold",
        "--labels-per-item", "1", "--num-queries", "4", "--rouge", "--device", "cpu", "--output-dir", tmp_path / "out"])
    rouge = found["rouge"]
    assert rouge["queries"] == 4 and list(rouge["rows"]) == [str(happy), "zero-shot", "lead-3", "reference"]
    assert rouge["rows"]["reference"] == {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    header = json.loads((tmp_path / "out" / "comparisons.json.session.jsonl").read_text().splitlines()[0])
    texts = {item["query_index"]: item for item in header["items"]}
    refs = [texts[i]["reference"] for i in range(4)]
    assert refs == [t["article"].split(". ")[0] + "." for t in texts.values()]  # each query's own reference
    zero = [t["sample_texts"][t["policies"].index("zero-shot")] for t in (texts[i] for i in range(4))]
    assert rouge["rows"]["zero-shot"] == rouge_f1(zero, refs)
    assert "R-1" in printed and "lead-3" in printed
