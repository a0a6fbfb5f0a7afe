"""run/checkpoint.py: what a checkpoint holds, written and read back, and the non-finite guard's one line; then kill,
stop and resume both scripts and compare with an uninterrupted run, and a NaN that stops each script's run with nothing
saved of it."""

import errno
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import torch
from helpers.assets import SHORT_TASK
from helpers.errors import assert_one_error_line
from helpers.events import drive
from helpers.processes import forked
from helpers.site.lmhp_events import EVENTS

from lm_human_preference_details.run import checkpoint as ckpt
from lm_human_preference_details.run.checkpoint import check_finite, list_checkpoints, load_checkpoint, save_checkpoint
from lm_human_preference_details.utils.errors import Stopped, UserError

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------------------------------------------ pieces
def test_check_finite_names_the_first_bad_quantity():
    layer = torch.nn.Linear(2, 2)
    check_finite("update 3", scores=torch.ones(4), loss=[0.5, 1.0], gradients=layer)
    with pytest.raises(UserError, match=r"^non-finite kl at update 3: the run stops here"):
        check_finite("update 3", scores=torch.ones(4), kl=torch.tensor([1.0, float("nan")]), loss=[float("inf")])
    with pytest.raises(UserError, match="non-finite loss at"):
        check_finite("update 3", scores=torch.ones(4), loss=[0.5, float("inf")])
    with torch.no_grad():
        layer.weight[0, 0] = float("nan")
    with pytest.raises(UserError, match="non-finite gradients at update 3"):
        check_finite("update 3", loss=[0.5], gradients=layer)


def test_plain_numbers_and_a_module_without_weights_are_checked_too():
    check_finite("update 0", lr=1e-5, steps=3, activation=torch.nn.ReLU())  # no weights: nothing non-finite
    with pytest.raises(UserError) as e:
        check_finite("the end of reward model training", lr=1e-5, gain=float("-inf"))
    assert str(e.value).startswith("non-finite gain at the end of reward model training: the run stops here and saves "
                                   "nothing from it (earlier checkpoints are kept)") and "\n" not in str(e.value)


def test_objects_round_trip_through_a_checkpoint(tmp_path):
    class Controller:  # a plain object: its attributes are its state (the KL controllers)
        def __init__(self):
            self.value = 0.15

    layer, controller = torch.nn.Linear(2, 2), Controller()
    optimizer = torch.optim.Adam(layer.parameters())
    layer(torch.ones(2)).sum().backward()
    optimizer.step()
    controller.value = 0.2
    objects = {"layer": layer, "optimizer": optimizer, "kl_ctl": controller}
    path = save_checkpoint(tmp_path, 7, ckpt.training_state(7, objects, elapsed=1.5), keep=1)
    fresh = {"layer": torch.nn.Linear(2, 2), "kl_ctl": Controller()}
    fresh["optimizer"] = torch.optim.Adam(fresh["layer"].parameters())
    state = load_checkpoint(path)
    assert ckpt.restore(state, fresh) == 7 and state["elapsed"] == 1.5 and fresh["kl_ctl"].value == 0.2
    assert torch.equal(fresh["layer"].weight, layer.weight)
    assert torch.equal(fresh["optimizer"].state_dict()["state"][0]["exp_avg"], optimizer.state_dict()["state"][0]["exp_avg"])


def test_keeps_the_newest_k(tmp_path):
    for update in (2, 4, 6):
        save_checkpoint(tmp_path, update, {"update": update}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_00000004", "update_00000006"]


def test_a_full_disk_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    good = save_checkpoint(tmp_path, 2, {"update": 2}, keep=1)

    def full_disk(state, path):
        path.write_bytes(b"half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt, "write_state", full_disk)
    with pytest.raises(UserError) as e:
        save_checkpoint(tmp_path, 4, {"update": 4}, keep=1)
    assert "No space left on device" in str(e.value) and f"the last good checkpoint is {good}" in str(e.value)
    assert "\n" not in str(e.value)
    assert list_checkpoints(tmp_path) == [good] and load_checkpoint(good) == {"update": 2}
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [good.name]  # no temporary left


def test_a_corrupt_checkpoint_is_one_line(tmp_path):
    path = save_checkpoint(tmp_path, 2, {"update": 2}, keep=1)
    (path / ckpt.STATE_FILE).write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="checkpoint .* is corrupt"):
        load_checkpoint(path)


# ------------------------------------------------------------------------------------------------ whole runs
# CI-sized runs: 6 updates of 8 episodes, queries of 16 tokens, responses of 8 (SHORT_TASK), a checkpoint every 2
# updates. Six are the least the killed run needs: the second checkpoint (update 4) to die in, then a stopped update 2
# that leaves one more update after it saves (update 3) to resume into.
UPDATES = 6


# Every run of this file on one CPU thread, in this process (helpers.fixtures.one_thread) and in its forks (`forked`): on
# two, these tiny runs spent ~40% more CPU time (OpenMP's threads waiting for work), and runs compared bit for bit share
# a count.
pytestmark = pytest.mark.usefixtures("one_thread")


def die_in_save(die_at: int) -> None:
    """In a run's process: its checkpoint writer dies half-way through the ``die_at``-th checkpoint file, as a kill -9
    there leaves it."""
    real, calls = ckpt.write_state, []

    def die_half_way(state, path):
        real(state, path)
        calls.append(path)
        if len(calls) == die_at:
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
            os.kill(os.getpid(), signal.SIGKILL)

    ckpt.write_state = die_half_way


@pytest.fixture(scope="module")
def reward_dir(tmp_path_factory, assets):
    """A (random) reward model saved the way train_reward.py saves one: enough to train a policy against."""
    from lm_human_preference_details.language.model import RewardModel, load_lm, save_model_dir
    from lm_human_preference_details.language.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(str(assets / "tiny-gpt2"))
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("rm") / "reward_model"
    save_model_dir(path, RewardModel(load_lm(str(assets / "tiny-gpt2")), tokenizer.pad_token_id), tokenizer,
                   {"task": {"query_length": 16, "response_length": 8}})
    return path


def policy_argv(assets, out, reward_dir=None, updates=UPDATES):
    reward = ["--rewards.trained-model", reward_dir] if reward_dir else []
    argv = ["--base-model", assets / "tiny-gpt2", *reward, "--task.query-dataset", assets / "queries.txt", *SHORT_TASK,
            "--ppo.total-episodes", 8 * updates, "--ppo.batch-size", 8, "--num-ranks", 1, "--ppo.noptepochs", 1,
            "--ppo.lr", 1e-3, "--rewards.target", 0.5, "--save-interval", 2, "--output-dir", out, "--device", "cpu"]
    return list(map(str, argv))


@pytest.fixture(scope="module")
def whole(assets, reward_dir, tmp_path_factory):
    """The uninterrupted run that every interrupted one is compared with."""
    import train_policy

    run = tmp_path_factory.mktemp("whole") / "run"
    train_policy.main(policy_argv(assets, run, reward_dir))
    return run


def hooked_run(argv, name: Path, kill_at: str = "", term_at: str = "", before=None) -> tuple[int, list[str], str, str]:
    """train_policy.py ``argv`` in a process of its own (a fork of this one, `forked`: the test's imports are the run's),
    with the run's events hook on (helpers.events), killed (SIGKILL) at the event ``kill_at`` or sent SIGTERM at
    ``term_at``; ``before``: a fault its process injects first; output in files beside ``name``. -> (exit code, events,
    stdout, stderr)."""
    events = name.with_suffix(".events")

    def act(event: str) -> None:
        if event in (kill_at, term_at):
            os.kill(pid, signal.SIGKILL if event == kill_at else signal.SIGTERM)

    pid = forked("train_policy.py", *argv, env_extra={EVENTS: events}, cwd=ROOT,
                 stdout=name.with_suffix(".out"), stderr=name.with_suffix(".err"), before=before)
    code, seen = drive(pid, events, act)
    return code, seen, name.with_suffix(".out").read_text(), name.with_suffix(".err").read_text()


def rows(run_dir):
    path = Path(run_dir) / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True) if path.exists() else []
    return [json.loads(line) for line in lines if line.endswith("\n")]


def steps(run_dir):
    return [r["step"] for r in rows(run_dir)]


def numbers(run_rows):
    """Every logged value but wall-clock time and throughput."""
    return [{k: v for k, v in r.items() if k not in ("ppo/elapsed/time", "ppo/elapsed/fps")} for r in run_rows]


def same_state(a, b) -> bool:
    """Exactly equal nested states: tensors element for element, containers item for item, the rest by ==."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_state(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(same_state(x, y) for x, y in zip(a, b))
    return a == b


def assert_same_numbers(got, expected):
    """Every row's numbers equal (`numbers`); else name the first step and keys that differ."""
    for a, b in zip(numbers(got), numbers(expected)):
        differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
        assert not differ, f"step {a['step']}: " + ", ".join(f"{k} {a.get(k)!r} != {b.get(k)!r}" for k in differ[:5])
    assert len(got) == len(expected)


def test_killed_stopped_and_resumed_run_equals_an_uninterrupted_one(assets, reward_dir, whole, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from transformers import AutoModelForCausalLM

    import train_policy

    run = tmp_path / "run"
    argv = policy_argv(assets, run, reward_dir)
    # 1. kill -9 half-way through the file of the second checkpoint (update 4), written by the saving thread while
    # the training loop goes on: the first checkpoint (update 2) stays the last good one
    code, _, _, err = hooked_run(argv, tmp_path / "in_save", before=lambda: die_in_save(2))
    assert code == -signal.SIGKILL, err[-3000:]
    half_written = list((run / "checkpoints").glob(".lmhp-tmp~*~update_00000004~*"))
    assert half_written and [p.name for p in list_checkpoints(run)] == ["update_00000002"]
    assert steps(run)[:4] == [0, 1, 2, 3] and steps(run) == list(range(len(steps(run))))
    # 2. resumed from update 2, its later logs dropped; kill -9 at its first update, 2 (the run stands still there)
    code, _, out, _ = hooked_run([*argv, "--resume"], tmp_path / "killed", kill_at="update 2")
    assert code == -signal.SIGKILL
    # first its resume line (it drops the killed run's later rows, which held update 3 at least)
    assert out.splitlines()[0] == f"resume: continuing from {run / 'checkpoints' / 'update_00000002'}"
    assert steps(run) == [0, 1, 2]
    assert not any(p.exists() for p in half_written) and [p.name for p in list_checkpoints(run)] == ["update_00000002"]
    # 3. resumed, then SIGTERM (a preempted job) during its first update: it finishes the update, saves and exits with
    # one line
    resumed_at = 2
    code, seen, _, err = hooked_run([*argv, "--resume"], tmp_path / "stopped", term_at=f"update {resumed_at}")
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert seen[0] == f"update {resumed_at}" and resumed_at < UPDATES - 1
    line = assert_one_error_line(subprocess.CompletedProcess(argv, code, "", err), status=128 + signal.SIGTERM, alone=False)
    assert f"stopped by SIGTERM after update {resumed_at}" in line and "continue with --resume" in line
    done = resumed_at + 1
    assert list_checkpoints(run)[-1].name == f"update_{done:08d}" and not list(run.rglob(".lmhp-tmp~*"))
    assert json.loads((run / "policy" / "hparams.json").read_text())["update"] == done
    # 4. resumed to the end, in this process like the uninterrupted run
    train_policy.main([*argv, "--resume"])
    assert f"resume: continuing from {run / 'checkpoints' / f'update_{done:08d}'}" in capsys.readouterr().out

    assert steps(run) == list(range(UPDATES))
    assert_same_numbers(rows(run), rows(whole))
    events = EventAccumulator(str(run))
    events.Reload()
    assert [e.step for e in events.Scalars("ppo/objective/kl")] == list(range(UPDATES))  # no step twice in TensorBoard
    for a, b in zip(AutoModelForCausalLM.from_pretrained(run / "policy").parameters(),
                    AutoModelForCausalLM.from_pretrained(whole / "policy").parameters()):
        assert torch.equal(a, b)
    assert json.loads((run / "policy" / "hparams.json").read_text())["update"] == UPDATES
    final, expected = load_checkpoint(list_checkpoints(run)[-1]), load_checkpoint(list_checkpoints(whole)[-1])
    for name in ("policy", "optimizer", "kl_ctl", "sampler", "ranks"):  # every weight, Adam moment, counter, generator
        assert same_state(final["objects"][name], expected["objects"][name]), name
    # 5. a second run into the same directory is refused in one line
    with pytest.raises(UserError, match="already holds a policy run; pass --resume to continue it, or --overwrite"):
        train_policy.main(argv)


def test_a_nan_stops_the_run_at_its_update_and_saves_nothing_from_it(assets, reward_dir, whole, tmp_path, monkeypatch):
    import train_policy

    real_rollout, calls = train_policy.rollout, []

    def rollout_with_nan(*a, **kw):  # a NaN score at update 3 (e.g. a corrupted reward model)
        data = real_rollout(*a, **kw)
        calls.append(1)
        if len(calls) == 4:
            data["scores"][5] = float("nan")
        return data

    monkeypatch.setattr(train_policy, "rollout", rollout_with_nan)
    run = tmp_path / "run"
    with pytest.raises(UserError, match=r"^non-finite scores at update 3: the run stops here and saves nothing"):
        train_policy.main(policy_argv(assets, run, reward_dir))
    assert [p.name for p in list_checkpoints(run)] == ["update_00000002"]  # the last good one, written completely
    assert json.loads((run / "policy" / "hparams.json").read_text())["update"] == 2
    assert_same_numbers(rows(run), rows(whole)[:3])  # the NaN update is not logged


# ------------------------------------------------------------------------------------------------ the reward model phase
@pytest.fixture(scope="module")
def tiny_labels(tmp_path_factory, tokenizer):
    """24 best-of-4 labels for queries of 16 tokens and responses of 8, in OpenAI's schema."""
    from helpers.assets import synthetic_labels

    path = tmp_path_factory.mktemp("labels") / "labels.json"
    path.write_text(json.dumps(synthetic_labels(24, 16, 8, tokenizer)))
    return path


def reward_argv(assets, labels, out):
    return list(map(str, ["--base-model", assets / "tiny-gpt2", "--labels.source", labels, "--labels.num-train", 16,
                          "--batch-size", 8, "--lr", 1e-3, "--task.query-dataset", assets / "queries.txt", *SHORT_TASK,
                          "--rollout-batch-size", 8, "--normalize-samples", 8, "--eval-labels", 0, "--output-dir", out,
                          "--device", "cpu"]))


def nan_at_call(monkeypatch, module, name, call, poison):
    """Replace ``module.name`` by a wrapper that returns ``poison(result)`` on its ``call``-th call."""
    real, calls = getattr(module, name), []

    def wrapper(*a, **kw):
        calls.append(1)
        result = real(*a, **kw)
        return poison(result) if len(calls) == call else result

    monkeypatch.setattr(module, name, wrapper)


@pytest.mark.parametrize("where, message", [
    ("loss", "non-finite loss at reward model batch 1: the run stops here"),  # NaN rewards of the labels' samples
    ("normalize", "non-finite weights at the end of reward model training"),  # NaN rewards of policy samples: bias NaN
])
def test_a_nan_stops_reward_training_in_one_line_and_saves_no_model(assets, tiny_labels, tmp_path, monkeypatch, capsys,
                                                                     where, message):
    import train_reward
    from lm_human_preference_details.utils.errors import run_main

    if where == "loss":
        nan_at_call(monkeypatch, train_reward, "rewards_of_labels", 2, lambda rewards: rewards * float("nan"))
    else:  # the second measurement is normalize_after's
        nan_at_call(monkeypatch, train_reward, "reward_stats", 2, lambda stats: (float("nan"), stats[1]))
    run = tmp_path / "reward"
    with pytest.raises(SystemExit) as e:
        run_main(lambda: train_reward.main(reward_argv(assets, tiny_labels, run)))
    err = capsys.readouterr().err
    line = assert_one_error_line(subprocess.CompletedProcess([], e.value.code, "", err), alone=False)
    assert line.startswith(f"error: {message}")
    assert not (run / "reward_model").exists() and not list(run.glob(".lmhp-tmp~*"))  # no model, nothing half-written
    batches = [r["step"] for r in rows(run) if "train_reward/minibatch/loss" in r]
    assert batches == ([0] if where == "loss" else [0, 1])  # the NaN batch is not logged


@pytest.fixture()
def tiny_reward_preset(tiny_labels) -> list[str]:
    """The options of the reward run that train_policy.py starts without --rewards.trained-model: 2 batches of 8."""
    new = "--rewards.train-new-model."
    return list(map(str, [f"{new}labels.source", tiny_labels, f"{new}labels.num-train", 16, f"{new}batch-size", 8,
                          f"{new}lr", 1e-3, f"{new}rollout-batch-size", 8, f"{new}normalize-samples", 8,
                          f"{new}eval-labels", 0]))


def sigterm_at_call(monkeypatch, module, name, call):
    """SIGTERM this process (a preempted job) during the ``call``-th call of ``module.name``."""
    def stop(result):
        os.kill(os.getpid(), signal.SIGTERM)
        return result

    nan_at_call(monkeypatch, module, name, call, stop)


def test_a_combined_run_retrains_an_unfinished_reward_model_and_reuses_a_finished_one(assets, tiny_reward_preset,
                                                                                       tmp_path, monkeypatch, capsys):
    import train_policy
    import train_reward

    whole, run = tmp_path / "whole", tmp_path / "run"
    train_policy.main(policy_argv(assets, whole, updates=4) + tiny_reward_preset)  # the reward model, then PPO
    argv = policy_argv(assets, run, updates=4) + tiny_reward_preset
    # 1. stopped during reward training: no reward model is saved
    with monkeypatch.context() as m:
        sigterm_at_call(m, train_reward, "rewards_of_labels", 1)
        with pytest.raises(Stopped, match=r"stopped by SIGTERM during reward model training \(batch 0\); --resume"):
            train_policy.main(argv)
    assert not (run / "reward" / "reward_model").exists()
    # 2. resumed: the reward model is trained again from its start, then PPO stops after update 1
    with monkeypatch.context() as m:
        sigterm_at_call(m, train_policy, "rollout", 2)
        with pytest.raises(Stopped, match="stopped by SIGTERM after update 1"):
            train_policy.main([*argv, "--resume"])
    assert f"resume: deleting the unfinished run in {run / 'reward'} and starting again" in capsys.readouterr().out
    assert [r["step"] for r in rows(run / "reward") if "train_reward/minibatch/loss" in r] == [0, 1]
    reward_files = {p.name: p.stat().st_mtime_ns for p in (run / "reward" / "reward_model").iterdir()}
    # 3. resumed: the finished reward model is reused as it is, PPO continues from update 2
    train_policy.main([*argv, "--resume"])
    out = capsys.readouterr().out
    assert f"resume: reusing the finished reward model {run / 'reward' / 'reward_model'}" in out
    assert f"resume: continuing from {run / 'checkpoints' / 'update_00000002'}" in out
    assert {p.name: p.stat().st_mtime_ns for p in (run / "reward" / "reward_model").iterdir()} == reward_files

    assert_same_numbers(rows(run / "reward"), rows(whole / "reward"))
    assert steps(run) == list(range(4))
    assert_same_numbers(rows(run), rows(whole))
    final, expected = load_checkpoint(list_checkpoints(run)[-1]), load_checkpoint(list_checkpoints(whole)[-1])
    assert final["config"]["reward_model_fingerprint"] == expected["config"]["reward_model_fingerprint"]
    for name in final["objects"]:
        assert same_state(final["objects"][name], expected["objects"][name]), name
