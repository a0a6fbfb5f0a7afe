"""A user's files are never lost: links, a literal `~`, `sample`'s run directory, disk full, damaged metrics,
checkpoint checksums, compare.py's unreadable input and label files. The data-loss cases assert every user file's
bytes unchanged; the others assert the exit status, one `error:` line, no traceback, and what is left on disk."""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.errors import assert_one_error_line
from helpers.processes import in_process, refused_in_process
from helpers.runs import fake_train, run_args

from lm_human_preference_details.label_format import OAI_PAD, load_best_of_n_labels
from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.run import checkpoint as ckpt
from lm_human_preference_details.run import checksums
from lm_human_preference_details.run.directory import LOCK, MARKER, read_marker
from lm_human_preference_details.run.lifecycle import Run
from lm_human_preference_details.utils.errors import UserError, run_main

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "disabled", "PYTHONPATH": str(ROOT)}


def python(*argv, cwd=None, env=None) -> subprocess.CompletedProcess:
    """``python ARGV`` from the repository root (or ``cwd``), offline."""
    return subprocess.run([sys.executable, *map(str, argv)], cwd=cwd or ROOT, env={**ENV, **(env or {})},
                          capture_output=True, text=True, timeout=600)


def refused(script: str, *args) -> tuple[int, list[str], str]:
    """``python SCRIPT ARGS`` (a path, or a module as `-m` takes it), refused, in this process (conftest's
    `refused_in_process`: a refused command costs no new interpreter's imports) -> (exit status, the `error` lines on
    stderr, stdout); no traceback."""
    result = refused_in_process(script, args, os.getcwd())
    assert "Traceback" not in result.stderr, result.stderr
    return result.returncode, [line for line in result.stderr.splitlines() if line.startswith("error")], result.stdout


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file below ``root`` (links not followed) with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


# ------------------------------------------------------------------------------------------------ label files
def test_a_json_true_in_a_label_file_is_no_token(tmp_path):
    record = {"query": [1, True, OAI_PAD], **{f"sample{i}": [10 + i, OAI_PAD] for i in range(4)}, "best": 0}
    path = tmp_path / "labels.json"
    path.write_text(json.dumps([record]))
    with pytest.raises(UserError, match=r"record 0: field 'query' holds a token outside .* not an integer"):
        load_best_of_n_labels(path, n=4, query_length=3, response_length=2, pad_id=50257)


# ------------------------------------------------------------------------------------------------ compare.py
def write_metrics_run(run_dir: Path, last_row: bytes) -> None:
    """A policy run directory whose metrics.jsonl ends with ``last_row``."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"task_name": "sentiment"}))
    rows = b"".join(json.dumps({"step": s, "ppo/objective/score": 1.0}).encode() + b"\n" for s in range(3))
    (run_dir / "metrics.jsonl").write_bytes(rows + last_row + b"\n")


@pytest.mark.parametrize("last_row", [b'{"step": Infinity, "ppo/objective/score": 1.0}',
                                      b'{"step": 1e400, "ppo/objective/score": 1.0}',
                                      b'{"step": 3, "ppo/objective/score": 1.0, "note": "\xff"}'],
                         ids=["Infinity", "1e400", "not-utf8"])
def test_compare_gives_unreadable_metrics_exit_2_in_one_line(tmp_path, last_row):
    write_metrics_run(tmp_path / "runs" / "policy_sentiment_seed1", last_row)
    proc = python(ROOT / "benchmarks" / "compare.py", "--task", "sentiment", "--ours",
                  tmp_path / "runs" / "policy_{task}_seed*", "--out", tmp_path / "out.md", "--check", "score")
    assert_one_error_line(proc, "metrics.jsonl:4: not a row of scalars with a step", alone=False)
    assert not (tmp_path / "out.md").exists()


def finished_run(path: Path, kind: str) -> Path:
    """A finished run's directory as the scripts leave it (marker, logs, model), with the user's notes."""
    (path / ("policy" if kind == "policy" else "reward_model")).mkdir(parents=True)
    (path / MARKER).write_text(json.dumps({"kind": kind, "id": "x"}))
    (path / "config.json").write_text("{}")
    (path / "metrics.jsonl").write_text('{"step": 0, "loss": 1.0}\n')
    (path / ("policy" if kind == "policy" else "reward_model") / "model.safetensors").write_bytes(os.urandom(32))
    (path / "notes.md").write_text("results discussed with the team")
    return path


def test_overwrite_removes_a_reward_link_as_a_link_and_keeps_what_it_points_to(tmp_path):
    """Data loss 1: `--overwrite` on a policy run whose `reward` is a link to a separate finished reward run."""
    other = finished_run(tmp_path / "other_reward_run", "reward")
    policy_run = finished_run(tmp_path / "P", "policy")
    (policy_run / "reward").symlink_to(other, target_is_directory=True)
    before = snapshot(other)
    with Run(run_args(policy_run, overwrite=True), "policy", inputs=[], ranks=Ranks(1, 1)):
        pass
    assert snapshot(other) == before and read_marker(other) == {"kind": "reward", "id": "x"}
    assert not os.path.lexists(policy_run / "reward") and not (policy_run / "policy").exists()
    assert (policy_run / "notes.md").read_text() == "results discussed with the team"


def test_overwrite_refuses_a_reward_model_reached_through_a_link_in_the_run(tmp_path):
    """Data loss 1b: `--rewards.trained-model P/reward/reward_model` with `P/reward` a link: an input of the run."""
    other = finished_run(tmp_path / "other_reward_run", "reward")
    policy_run = finished_run(tmp_path / "P", "policy")
    (policy_run / "reward").symlink_to(other, target_is_directory=True)
    before = snapshot(tmp_path)
    model = str(policy_run / "reward" / "reward_model")
    with pytest.raises(UserError, match=r"--overwrite would delete .*reward_model, an input of this run"):
        with Run(run_args(policy_run, overwrite=True), "policy", inputs=[model], ranks=Ranks(1, 1)):
            pass
    assert snapshot(tmp_path) == before and (policy_run / "reward").is_symlink()


def reward_argv(assets: Path, out: Path) -> list:
    """A reward run of the tiny model that trains one batch of 8 labels (the label file's 64-token queries and 24-token
    responses), into ``out``."""
    return ["train_reward.py", "--base-model", assets / "tiny-gpt2", "--labels.source", assets / "labels.json",
            "--task.query-dataset", assets / "queries.txt", "--device", "cpu", "--labels.num-train", 8, "--batch-size", 8,
            "--rollout-batch-size", 8, "--normalize-samples", 8, "--eval-labels", 0, "--task.query-length", 64,
            "--task.response-length", 24, "--output-dir", out]


def test_a_literal_tilde_in_output_dir_is_the_home_directory_for_checks_and_writes(assets, tmp_path):
    """Data loss 2: `--output-dir=~/userdir` (a tilde the shell left alone) never writes to `./~/userdir`, and a second
    run into it is refused. The first run trains in this process (helpers.processes.in_process, with this test's HOME and
    working directory); the refused second is the file's one real `python train_reward.py`, whose HOME and working
    directory come from its environment as a user's do."""
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    (cwd / "~" / "userdir").mkdir(parents=True)
    (cwd / "~" / "userdir" / "config.json").write_text('{"the user": "config"}')
    before = snapshot(cwd)
    argv = [*reward_argv(assets, "x")[:-2], "--output-dir=~/userdir"]
    in_process(*argv, env_extra={"HOME": home}, cwd=cwd)
    assert read_marker(home / "userdir")["kind"] == "reward" and (home / "userdir" / "reward_model").is_dir()
    refused = python(ROOT / argv[0], *argv[1:], cwd=cwd, env={"HOME": str(home)})
    assert_one_error_line(refused, "already holds a reward run", alone=False)
    assert snapshot(cwd) == before


def tiny_policy_argv(assets: Path) -> list:
    return ["--base-model", assets / "tiny-gpt2", "--task.query-dataset", assets / "queries.txt", "--device", "cpu",
            "--task.query-length", 64, "--task.response-length", 24, "--task.truncate-after", 4]


@pytest.mark.parametrize("tool", ["train_reward.py", "train_policy.py", "sample"])
def test_a_dangling_link_as_output_dir_is_one_line(assets, tmp_path, tool):
    """Each command's main in this process under run_main, as its `__main__` runs it (the real command's exit status
    and one line are the tilde test's and test_sample's subprocesses)."""
    (tmp_path / "out").symlink_to(tmp_path / "gone")
    if tool == "sample":
        argv = ["lm_human_preference_details.sample", "--policy", assets / "tiny-gpt2", "--task.query-dataset",
                assets / "queries.txt", "--device", "cpu"]
    else:
        argv = [tool, *tiny_policy_argv(assets), "--labels.source", assets / "labels.json"]
        if tool == "train_policy.py":
            argv[-2] = "--rewards.train-new-model.labels.source"
    status, err, _ = refused(*argv, "--output-dir", tmp_path / "out")
    assert status == 2 and len(err) == 1 and "is a symbolic link to" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] and (tmp_path / "out").is_symlink()


# ------------------------------------------------------------------------------------------------ sample's directory
def sample_main(assets: Path, out: Path, *extra) -> list[dict]:
    """`python -m lm_human_preference_details.sample` in-process, the tiny base model as the policy."""
    from lm_human_preference_details import sample

    return sample.main(["--policy", str(assets / "tiny-gpt2"), "--task.query-dataset", str(assets / "queries.txt"),
                        "--task.query-length", "16", "--task.response-length", "4", "--device", "cpu",
                        "--num-queries", "2", "--output-dir", str(out), *map(str, extra)])


def test_sample_never_writes_over_a_users_directory_or_a_training_run(assets, tmp_path, monkeypatch):
    """Data loss 3: `sample --output-dir D` into a directory of notes, or a finished policy run: refused before any
    sampling, every file as it was."""
    from lm_human_preference_details import sample

    monkeypatch.setattr(sample, "sample_policy", lambda *a, **k: pytest.fail("sampled before checking --output-dir"))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "samples.jsonl").write_text("my own samples\n")
    (notes / "metrics.jsonl").write_text("my own metrics\n")
    policy_run = finished_run(tmp_path / "policy_run", "policy")
    before = snapshot(tmp_path)
    with pytest.raises(UserError, match="holds files that are not a run of this project"):
        sample_main(assets, notes)
    for flag in ((), ("--overwrite",)):
        with pytest.raises(UserError, match="holds a policy run, and this is a sample run"):
            sample_main(assets, policy_run, *flag)
    assert snapshot(tmp_path) == before


def test_sample_obeys_the_marker_and_overwrite(assets, tmp_path):
    out = tmp_path / "samples"
    first = sample_main(assets, out)
    assert read_marker(out)["kind"] == "sample" and len(first) == 4
    (out / "notes.md").write_text("what I saw")
    with pytest.raises(UserError, match="already holds a sample run; pass --overwrite to replace it"):
        sample_main(assets, out, "--seed", "2")
    assert [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()] == first
    second = sample_main(assets, out, "--seed", "2", "--overwrite")
    assert [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()] == second != first
    assert (out / "notes.md").read_text() == "what I saw"


def test_sample_under_a_regular_file_is_refused_before_sampling(assets, tmp_path):
    (tmp_path / "file").write_text("a user's file")
    status, err, out = refused("lm_human_preference_details.sample", "--policy", assets / "tiny-gpt2",
                          "--task.query-dataset", assets / "queries.txt", "--device", "cpu", "--output-dir",
                          tmp_path / "file" / "out")
    assert status == 2 and len(err) == 1 and "lies under the file" in err[0], err
    assert "query 0:" not in out and (tmp_path / "file").read_text() == "a user's file"


# ------------------------------------------------------------------------------------------------ a full disk
@pytest.mark.parametrize("name", [MARKER, "config.json"])
def test_a_full_disk_at_the_marker_or_config_is_one_line_and_leaves_nothing(assets, tmp_path, monkeypatch, name):
    """The first write_text of the file ``name`` fails as on a full disk: the file is made, its bytes never arrive."""
    real = Path.write_text

    def full_at(path, data, *args, **kwargs):
        if path.name == name:
            open(path, "w").close()  # as a full disk does it: the file is made, its bytes never arrive
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        return real(path, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_at)
    out = tmp_path / "runs" / "r"
    status, err, _ = refused(*reward_argv(assets, out))
    assert status == 2 and len(err) == 1 and "No space left on device" in err[0], err
    assert not out.exists()  # no 0-byte marker, no lock: the directory this run made is gone (docs/runs.md)


def exit_line(capsys, fn) -> tuple[int, list[str]]:
    """``fn`` under run_main, as the scripts run it: (exit status, the `error` lines on stderr); no traceback."""
    with pytest.raises(SystemExit) as e:
        run_main(fn)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return e.value.code, [line for line in err.splitlines() if line.startswith("error")]


def test_torch_saves_runtime_error_on_a_full_disk_is_one_line_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    real = ckpt.write_state
    calls = []

    def full_at_second_save(state, path):
        calls.append(path)
        if len(calls) == 2:  # what torch.save raised when the disk filled half-way through a checkpoint
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 9344 vs 9232")
        real(state, path)

    monkeypatch.setattr(ckpt, "write_state", full_at_second_save)
    status, err = exit_line(capsys, lambda: fake_train(tmp_path / "run"))
    assert status == 2 and len(err) == 1 and "update_00000004" in err[0], err
    assert err[0].startswith("error: cannot save") and "the last good checkpoint is" in err[0]
    assert [p.name for p in ckpt.list_checkpoints(tmp_path / "run")] == ["update_00000002"]
    monkeypatch.setattr(ckpt, "write_state", real)
    resumed = fake_train(tmp_path / "run", resume=True)
    assert resumed == fake_train(tmp_path / "fresh")[2:]  # the run goes on where its last checkpoint left it


def test_a_full_disk_at_a_metrics_row_is_one_line_and_the_run_resumes(tmp_path, monkeypatch, capsys):
    from lm_human_preference_details.run import tracking

    real_log = tracking.Tracker.log

    def full_at_update_3(self, metrics, step):
        if step == 3:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_log(self, metrics, step)

    monkeypatch.setattr(tracking.Tracker, "log", full_at_update_3)
    status, err = exit_line(capsys, lambda: fake_train(tmp_path / "run"))
    assert status == 2 and len(err) == 1 and err[0].startswith("error: the disk is full") and "--resume" in err[0], err
    assert read_marker(tmp_path / "run") is not None and ckpt.list_checkpoints(tmp_path / "run")
    monkeypatch.setattr(tracking.Tracker, "log", real_log)
    fake_train(tmp_path / "run", resume=True)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]


# ------------------------------------------------------------------------------------------------ --resume's inputs
@pytest.mark.parametrize("bad", [b'{"step": 1, "loss": 1.0', b'{"step": 1, "loss": "\xff"}'], ids=["malformed", "not-utf8"])
def test_a_damaged_metrics_row_stops_a_resume_in_one_line_naming_it(tmp_path, capsys, bad):
    fake_train(tmp_path / "run", updates=4)
    metrics = tmp_path / "run" / "metrics.jsonl"
    lines = metrics.read_bytes().split(b"\n")
    metrics.write_bytes(b"\n".join([lines[0], bad, *lines[2:]]))
    before = {k: v for k, v in snapshot(tmp_path).items() if not k.endswith(LOCK)}
    status, err = exit_line(capsys, lambda: fake_train(tmp_path / "run", updates=6, resume=True))
    assert status == 2 and len(err) == 1 and "metrics.jsonl line 2 is not a row of metrics" in err[0], err
    assert "fix or delete that line" in err[0]
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.endswith(LOCK)} == before  # nothing written


def flip_a_weight_bit(state_file: Path, weight: torch.Tensor) -> None:
    """Flip one bit inside ``weight``'s bytes in a saved state.pt: the file still loads, with another weight."""
    data = bytearray(state_file.read_bytes())
    at = bytes(data).index(weight.numpy().tobytes())
    data[at] ^= 0x10
    state_file.write_bytes(bytes(data))


def test_a_checkpoint_with_a_flipped_bit_is_never_resumed_from(tmp_path, capsys):
    fake_train(tmp_path / "run", updates=4, keep_checkpoints=2)
    older, newer = ckpt.list_checkpoints(tmp_path / "run")
    weight = ckpt.load_checkpoint(newer)["objects"]["layer"]["weight"]
    flip_a_weight_bit(newer / ckpt.STATE_FILE, weight)
    before = {k: v for k, v in snapshot(tmp_path).items() if not k.endswith(LOCK)}
    status, err = exit_line(capsys, lambda: fake_train(tmp_path / "run", updates=6, resume=True, keep_checkpoints=2))
    assert status == 2 and len(err) == 1, err
    assert f"{newer / ckpt.STATE_FILE} does not match its sha256" in err[0] and f"before it, {older}" in err[0]
    assert {k: v for k, v in snapshot(tmp_path).items() if not k.endswith(LOCK)} == before


@pytest.mark.parametrize("with_checksums", [True, False], ids=["checksummed", "saved-before-checksums"])
def test_a_foreign_torch_file_as_state_pt_is_one_line(tmp_path, capsys, with_checksums):
    fake_train(tmp_path / "run", updates=2)
    (checkpoint,) = ckpt.list_checkpoints(tmp_path / "run")
    torch.save({"weight": torch.ones(2)}, checkpoint / ckpt.STATE_FILE)
    if not with_checksums:
        (checkpoint / checksums.CHECKSUMS).unlink()
    status, err = exit_line(capsys, lambda: fake_train(tmp_path / "run", updates=4, resume=True))
    message = "does not match its sha256" if with_checksums else "is not a training checkpoint of this project"
    assert status == 2 and len(err) == 1 and message in err[0] and "--overwrite starts the run again" in err[0], err
    assert ckpt.list_checkpoints(tmp_path / "run") == [checkpoint]


def test_compare_reads_and_writes_a_literal_tilde_as_the_home_directory(tmp_path, monkeypatch):
    from benchmarks import compare

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    args = compare.parse_args(["--task", "sentiment", "--ours=~/runs/policy_{task}_seed*", "--out=~/compare.md"])
    assert (args.ours, args.out) == (f"{tmp_path}/home/runs/policy_{{task}}_seed*", f"{tmp_path}/home/compare.md")


def test_a_full_disk_is_told_by_the_error_not_its_class():
    """The errors a real full tmpfs raised here (torch.save, safetensors, a text write), and look-alikes that are not."""
    from safetensors import SafetensorError

    from lm_human_preference_details.utils.errors import disk_full

    full = [RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"),
            SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),
            OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))]
    other = [RuntimeError("CUDA out of memory"), OSError(errno.EACCES, os.strerror(errno.EACCES)), ValueError("pos")]
    assert [disk_full(e) for e in full + other] == [True] * len(full) + [False] * len(other)


def test_a_synced_temporary_is_whole_fsynced_readable_as_the_umask_allows_and_known_as_ours(tmp_path, monkeypatch):
    """files.synced_temporary (the label file's and its journal's first copy): the bytes, fsynced before it is
    returned, the umask's mode (not mkstemp's 0600), a name `remove_leftovers` takes back once its owner is gone."""
    from lm_human_preference_details.utils import files

    synced = []
    monkeypatch.setattr(files.os, "fsync", lambda fd: synced.append(os.fstat(fd).st_ino))
    umask = os.umask(0o027)
    try:
        tmp = files.synced_temporary(tmp_path / "labels.json", b"[]\n")
    finally:
        os.umask(umask)
    assert tmp.parent == tmp_path and tmp.read_bytes() == b"[]\n" and synced == [tmp.stat().st_ino]
    assert tmp.stat().st_mode & 0o777 == 0o640
    assert tmp.name.startswith(f"{files.TMP}~{files.HOST}~{os.getpid()}~labels.json~")


# ------------------------------------------------------------------------------------ the cache, a config, a nested save
def test_a_cache_under_a_regular_file_or_on_a_read_only_file_system_is_one_line_naming_lmhp_cache(tmp_path,
                                                                                                 monkeypatch):
    from lm_human_preference_details.utils import files

    (tmp_path / "file").write_text("mine")
    result = refused_in_process("lm_human_preference_details.label", ["--task", "offline", "--output", tmp_path / "l.json"],
                                tmp_path, {"LMHP_CACHE": tmp_path / "file" / "cache"})
    assert_one_error_line(result, f"the cache LMHP_CACHE={tmp_path / 'file' / 'cache'} cannot be written",
                          alone=False)
    assert "set LMHP_CACHE to a directory this process can write" in result.stderr
    assert (tmp_path / "file").read_text() == "mine" and not (tmp_path / "l.json").exists()

    def read_only(*args, **kwargs):  # what a read-only mount answers (root passes any permission bit, so not a chmod)
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(files, "CACHE_DIR", tmp_path / "cache")
    monkeypatch.setattr(files.tempfile, "mkdtemp", read_only)
    with pytest.raises(UserError, match=f"LMHP_CACHE={tmp_path / 'cache'} cannot be written .*Read-only"):
        with files.atomic_path(tmp_path / "cache" / "v1" / "queries.txt"):
            pass
    with pytest.raises(OSError) as elsewhere:  # elsewhere (a run directory) the error is not the cache's
        with files.atomic_path(tmp_path / "run" / "config.json"):
            pass
    assert not isinstance(elsewhere.value, UserError)


@pytest.mark.parametrize("config, message", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"], "vocab_size": "50257"},
     "config.json's vocab_size is '50257', not an integer"),
    (["gpt2"], "config.json holds a JSON list, not a model's config (an object)"),
], ids=["vocab_size-a-string", "a-json-list"])
def test_a_policy_whose_config_json_is_not_a_models_is_one_line(tiny_model_dir, tmp_path, config, message):
    import shutil

    from lm_human_preference_details.language.trained_models import check_policy_path
    from lm_human_preference_details.tasks import TaskHParams, positions_needed

    policy = tmp_path / "policy"
    shutil.copytree(tiny_model_dir, policy)
    (policy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match=re.escape(message)) as error:
        check_policy_path("--policy", str(policy), None, positions_needed(TaskHParams(query_length=8, response_length=8)))
    assert "\n" not in str(error.value) and f"--policy {policy}" in str(error.value)


def test_a_full_disk_at_an_online_trainings_save_names_the_runs_last_checkpoint(tmp_path):
    """RUN/online/reward_01 has no checkpoint of its own; the run that holds it has, and --resume continues from it."""
    good = ckpt.save_checkpoint(tmp_path, 1, {"update": 1}, keep=1)
    with pytest.raises(UserError) as error:
        with ckpt.save_errors(tmp_path / "online" / "reward_01", tmp_path / "online" / "reward_01" / "reward_model"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    assert f"the last good checkpoint is {good}" in str(error.value) and "no checkpoint was saved" not in str(error.value)
