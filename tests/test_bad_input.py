"""Bad input of every kind ends in one `error:` line naming the flag, a non-zero exit, and nothing written (issue 22).

Values are checked in-process through Args.finalize (fast); parse errors, files read before the run, `sample` and
torchrun in real processes, each in an empty working directory that must stay empty.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1",
       "PYTHONPATH": str(ROOT)}


def run_forked(script: str, cases: list[list], work: Path) -> list[subprocess.CompletedProcess]:
    """`python SCRIPT ARGS` for each ARGS of ``cases`` (one import of the script, a fork per case; test_smoke's
    FORK_RUNNER), run in the empty directory work/cwd."""
    from test_smoke import FORK_RUNNER

    (work / "cwd").mkdir(parents=True)
    (work / "runner").mkdir()
    spec = {"module": Path(script).stem, "script": str(ROOT / script), "dir": str(work / "runner"),
            "cases": [([str(a) for a in argv], {}, None) for argv in cases]}
    env = {**os.environ, **ENV, "LMHP_CACHE": str(work / "cache")}
    runner = subprocess.run([sys.executable, "-c", FORK_RUNNER, json.dumps(spec)], capture_output=True, text=True,
                            cwd=work / "cwd", env=env, timeout=900)
    assert runner.returncode == 0, runner.stderr[-3000:]
    codes = json.loads((work / "runner" / "codes.json").read_text())
    read = lambda i, name: (work / "runner" / f"{i}.{name}").read_text()  # noqa: E731
    return [subprocess.CompletedProcess(argv, code, read(i, "out"), read(i, "err"))
            for i, (argv, code) in enumerate(zip(cases, codes))]


def assert_refused(result, message: str, out: Path, cwd: Path) -> None:
    """Exit != 0; stderr is exactly one `error:` line holding ``message``; no traceback; ``out`` and ``cwd`` untouched."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode != 0, result.stderr[-2000:]
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr[-2000:]
    assert "Traceback" not in result.stderr + result.stdout
    assert not out.exists(), sorted(out.rglob("*"))
    assert not any(cwd.iterdir()), sorted(cwd.iterdir())


# ------------------------------------------------------------------------------------------- values (finalize)
POLICY_VALUES = [
    ("ppo.lr", -1.0, "--ppo.lr is -1.0"), ("ppo.lr", 0.0, "--ppo.lr is 0.0"), ("ppo.lr", float("nan"), "--ppo.lr is nan"),
    ("ppo.lr", float("inf"), "--ppo.lr is inf"),
    ("ppo.gamma", 2.0, "--ppo.gamma is 2.0"), ("ppo.gamma", 0.0, "--ppo.gamma is 0.0"),
    ("ppo.gamma", float("nan"), "--ppo.gamma is nan"),
    ("ppo.lam", 1.5, "--ppo.lam is 1.5"), ("ppo.lam", -0.1, "--ppo.lam is -0.1"),
    ("ppo.cliprange", 0.0, "--ppo.cliprange is 0.0"), ("ppo.cliprange_value", -0.2, "--ppo.cliprange-value is -0.2"),
    ("rewards.kl_coef", -1.0, "--rewards.kl-coef is -1.0"), ("rewards.kl_coef", float("inf"), "--rewards.kl-coef is inf"),
    ("rewards.train_new_model.lr", 0.0, "--rewards.train-new-model.lr is 0.0"),
    ("task.truncate_token", -3, "--task.truncate-token is -3"),
    ("task.temperature", float("inf"), "--task.temperature is inf"),
    ("task.penalty_reward_value", float("nan"), "--task.penalty-reward-value is nan"),
    ("seed", -1, "--seed is -1"), ("seed", 2**32 - 1, "--seed is 4294967295"),
]
REWARD_VALUES = [
    ("lr", -1.0, "--lr is -1.0"), ("lr", 0.0, "--lr is 0.0"), ("lr", float("nan"), "--lr is nan"),
    ("lr", float("inf"), "--lr is inf"), ("seed", -1, "--seed is -1"),
    ("task.truncate_token", -1, "--task.truncate-token is -1"),
]


def _set(args, field: str, value) -> None:
    *path, name = field.split(".")
    target = args
    for part in path:
        target = getattr(target, part)
    setattr(target, name, value)


@pytest.mark.parametrize("script, field, value, message", [("train_policy", *case) for case in POLICY_VALUES]
                         + [("train_reward", *case) for case in REWARD_VALUES])
def test_values_the_original_would_reject_are_refused(script, field, value, message, tmp_path):
    import importlib

    from lm_human_preference_details.errors import UserError

    args = importlib.import_module(script).build_args("sentiment")
    args.output_dir = str(tmp_path / "run")
    _set(args, field, value)
    with pytest.raises(UserError) as e:
        args.finalize(check_inputs=False)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)
    assert not (tmp_path / "run").exists()


def test_the_edges_of_each_range_are_accepted(tmp_path):
    import train_policy

    args = train_policy.build_args("sentiment")
    args.output_dir, args.seed, args.num_ranks = str(tmp_path / "run"), 2**32 - 1 - 7 * 100003, 8
    args.ppo.gamma, args.ppo.lam, args.rewards.kl_coef, args.task.truncate_token = 1.0, 0.0, 0.0, None
    args.finalize(check_inputs=False)  # gamma 1, lam 0, no KL penalty, no truncation, the largest seed: all trainable
    args = train_policy.build_args("sentiment")
    args.output_dir, args.ppo.lam, args.seed = str(tmp_path / "run"), 1.0, 0
    args.finalize(check_inputs=False)


def test_truncate_token_outside_the_base_models_vocabulary(assets):
    from lm_human_preference_details.errors import UserError
    from lm_human_preference_details.tasks import TaskHParams, check_task_inputs

    task = TaskHParams(query_dataset=str(assets / "queries.txt"), truncate_token=50257)  # [PAD], no real token
    with pytest.raises(UserError, match=r"--task.truncate-token is 50257, but --base-model .* has 50257 tokens"):
        check_task_inputs(task, str(assets / "tiny-gpt2"))
    check_task_inputs(TaskHParams(query_dataset=str(assets / "queries.txt"), truncate_token=50256), str(assets / "tiny-gpt2"))


def test_only_process_0_prints_the_error(monkeypatch, capsys):
    from lm_human_preference_details import errors

    def fail():
        raise errors.UserError("--ppo.lr is -1.0")

    monkeypatch.setattr(errors, "OTHER_RANKS_WAIT_S", 0.0)
    for rank, expected in (("0", "error: --ppo.lr is -1.0\n"), ("1", "error: --ppo.lr is -1.0 (process 1)\n")):
        monkeypatch.setenv("RANK", rank)
        with pytest.raises(SystemExit) as e:
            errors.run_main(fail)
        assert e.value.code == 2 and capsys.readouterr().err == expected


def test_help_is_tyros(capsys):
    import train_policy

    with pytest.raises(SystemExit) as e:
        train_policy.main(["--help"])
    out = capsys.readouterr()
    assert e.value.code == 0 and out.out.startswith("usage: ") and "--ppo.lr FLOAT" in out.out and not out.err


# ------------------------------------------------------------------------- real processes: parse errors, files
@pytest.fixture(scope="module")
def bad_files(assets, tmp_path_factory) -> Path:
    """Query and label files that today are read after the run directory is written."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = tmp_path_factory.mktemp("bad-files")
    (d / "queries.csv").write_text("text\nOnce upon a time.\n")
    (d / "no-text.jsonl").write_text('{"body": "Once upon a time."}\n')
    (d / "empty.txt").write_text("\n\n")
    pq.write_table(pa.table({"body": ["Once upon a time."]}), d / "no-text.parquet")
    records = json.loads((assets / "labels.json").read_text())
    pad_query = json.loads(json.dumps(records))
    pad_query[3]["query"] = [50259] * len(pad_query[3]["query"])  # a label whose query is all pads
    (d / "pad-query.json").write_text(json.dumps(pad_query))
    (d / "few-labels.json").write_text(json.dumps(records[:32]))
    return d


def reward_args(assets, out):
    return ["--base-model", assets / "tiny-gpt2", "--labels.source", assets / "labels.json", "--labels.num-train", 64,
            "--batch-size", 16, "--lr", 1e-3, "--task.query-dataset", assets / "queries.txt", "--rollout-batch-size", 64,
            "--normalize-samples", 64, "--eval-labels", 32, "--seed", 3, "--output-dir", out, "--device", "cpu"]


# (extra arguments, the message); {f}: bad_files
REWARD_CASES = {
    "unknown-flag": (["--bogus", "1"], "unrecognized options: --bogus, 1; run "),
    "misspelt-flag": (["--lrr", "1"], "perhaps you meant --lr"),
    "lr-not-a-number": (["--lr", "abc"], "cannot parse --lr: could not convert string to float: 'abc'"),
    "missing-value": (["--lr"], "--lr is missing its value"),
    "value-after-a-switch": (["--track", "yes"], "yes (after --track, which takes no value)"),
    "truncate-token-not-a-number": (["--task.truncate-token", "abc"], "cannot parse --task.truncate-token: expected"),
    "lr-negative": (["--lr", "-1"], "--lr is -1.0"),
    "lr-nan": (["--lr", "nan"], "--lr is nan"),
    "seed-negative": (["--seed", "-1"], "--seed is -1"),
    "truncate-token-outside-vocab": (["--task.truncate-token", "99999"], "--task.truncate-token is 99999, but --base-model"),
    "csv-query-file": (["--task.query-dataset", "{f}/queries.csv"], "unknown file type '.csv'"),
    "jsonl-without-text": (["--task.query-dataset", "{f}/no-text.jsonl"], "line 1: expected a JSON string or an object"),
    "parquet-without-text": (["--task.query-dataset", "{f}/no-text.parquet"], "has no column 'text' (columns: body)"),
    "query-file-without-texts": (["--task.query-dataset", "{f}/empty.txt"], "holds no texts"),
    "label-query-all-pads": (["--labels.source", "{f}/pad-query.json"], "record 3: field 'query' starts with the pad 50259"),
    "too-few-labels": (["--labels.source", "{f}/few-labels.json"], "holds 32 labels but --labels.num-train is 64"),
}


@pytest.fixture(scope="module")
def reward_results(assets, bad_files, tmp_path_factory):
    work = tmp_path_factory.mktemp("reward-bad-input")
    cases = [reward_args(assets, work / "out" / key) + [str(a).format(f=bad_files) for a in change]
             for key, (change, _) in REWARD_CASES.items()]
    return work, dict(zip(REWARD_CASES, run_forked("train_reward.py", cases, work)))


@pytest.mark.parametrize("key", REWARD_CASES)
def test_reward_bad_input_is_one_line_before_anything_is_written(reward_results, key):
    work, results = reward_results
    assert_refused(results[key], REWARD_CASES[key][1], work / "out" / key, work / "cwd")


def test_policy_parse_errors_and_values_are_one_line(assets, tmp_path):
    base = ["--base-model", assets / "tiny-gpt2", "--task.query-dataset", assets / "queries.txt", "--device", "cpu"]
    cases = {"lr-not-a-number": (["--ppo.lr", "abc"], "cannot parse --ppo.lr"),
             "lr-nan": (["--ppo.lr", "nan"], "--ppo.lr is nan"),
             "gamma-2": (["--ppo.gamma", "2"], "--ppo.gamma is 2.0"),
             "kl-coef-negative": (["--rewards.kl-coef", "-1"], "--rewards.kl-coef is -1.0")}
    results = run_forked("train_policy.py", [base + ["--output-dir", tmp_path / "out" / k] + change
                                             for k, (change, _) in cases.items()], tmp_path)
    for (key, (_, message)), result in zip(cases.items(), results):
        assert_refused(result, message, tmp_path / "out" / key, tmp_path / "cwd")


def test_sample_on_a_run_directory_or_checkpoint_names_the_policy_to_pass(tiny_model_dir, tmp_path):
    from test_smoke import run_cases

    run = tmp_path / "run"  # what train_policy.py leaves: config.json, policy/, checkpoints/update_N/state.pt
    (run / "policy").mkdir(parents=True)
    (run / "checkpoints" / "update_00000002").mkdir(parents=True)
    (run / "checkpoints" / "update_00000002" / "state.pt").write_bytes(b"")
    (run / "config.json").write_text("{}")
    reward_run = tmp_path / "reward-run"
    (reward_run / "reward_model").mkdir(parents=True)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    cases = [
        (["--policy", run / "checkpoints" / "update_00000002"], f"is a training checkpoint of the run {run}, not a saved "
         f"policy; pass --policy {run / 'policy'}"),
        (["--policy", run], f"is a run directory, not a saved policy; pass --policy {run / 'policy'}"),
        (["--policy", reward_run], "is a reward model run (train_reward.py), not a policy"),
        (["--compare", run, "--policy", tiny_model_dir], f"pass --compare {run / 'policy'}"),
        ([], "--policy runs/policy_sentiment_seed1/policy does not exist (the default of --task sentiment): train one "
         "with `python train_policy.py --task sentiment`"),
    ]
    results = run_cases("lm_human_preference_details.sample", [([*argv, "--output-dir", tmp_path / "out"], {}, cwd)
                                                              for argv, _ in cases], tmp_path / "forked", ENV)
    for (_, message), result in zip(cases, results):
        assert_refused(result, message, tmp_path / "out", cwd)
        assert "--base-model" not in result.stderr  # a flag sample does not have


def test_torchrun_prints_the_error_once(assets, tmp_path):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                             str(ROOT / "train_reward.py"), *map(str, reward_args(assets, tmp_path / "out")), "--lr", "-1"],
                            capture_output=True, text=True, cwd=cwd, env={**os.environ, **ENV}, timeout=600)
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error: ")]
    assert result.returncode != 0
    assert errors == ["error: --lr is -1.0, but it is the initial learning rate and must be a finite number > 0; pass a "
                      "positive --lr"], result.stderr[-3000:]
    assert "train_reward.py\", line" not in result.stderr  # torchrun's own ChildFailedError block, no traceback of ours
    assert not (tmp_path / "out").exists() and not any(cwd.iterdir())


# ----------------------------------------------------------------------------- the offline report's held-out queries
def test_offline_report_evaluates_a_run_on_label_queries(tokenizer, tmp_path, monkeypatch):
    from lm_human_preference_details import offline
    from lm_human_preference_details.tasks import TaskHParams

    passages = offline.corpus(40, seed=2)
    (tmp_path / "queries_test.txt").write_text("\n\n".join(passages) + "\n")
    monkeypatch.setattr(offline, "offline_dir", lambda: tmp_path)  # where the offline assets keep their held-out passages
    labels_run = TaskHParams(query_dataset="oai-label-queries", query_length=32).resolved()
    text_run = TaskHParams(query_dataset=str(tmp_path / "queries.txt"), query_length=32).resolved()  # start, end: '.'
    queries = offline.heldout_queries(tokenizer, labels_run, 8, seed=5)
    # the label file's queries were cut from the corpus with '.' as start and end text (make_labels): so are these
    assert queries.shape == (8, 32) and queries.equal(offline.heldout_queries(tokenizer, text_run, 8, seed=5))
    texts = [tokenizer.decode([t for t in q if t != tokenizer.pad_token_id]) for q in queries.tolist()]
    assert all(any(t.strip()[:20] in p for p in passages) for t in texts)
