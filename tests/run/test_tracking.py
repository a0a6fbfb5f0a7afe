"""tracking.py: a resumed run's logs continue the killed run's without showing any step twice; a combined run is one
W&B run laid out as the baseline's."""

import json
import time

import pytest
from helpers.wandb_offline import offline_runs

from lm_human_preference_details.run.tracking import Tracker, WandbLayout, keep_rows_before


def _tracker(run_dir, track=False, **kw):
    return Tracker(run_dir, {"seed": 1}, track=track, project="p", entity=None, name="n", **kw)


def test_keep_rows_before_drops_later_and_cut_rows(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "x": s}) + "\n" for s in range(5)) + '{"step": 5, "x"')
    keep_rows_before(path, 3)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [0, 1, 2]


def test_a_resumed_tracker_shows_each_step_once(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    real_time = time.time
    # TensorBoard reads a directory's event files in name order, events.out.tfevents.SECOND.HOST.PID.N: the killed run
    # wrote its file long before the resume did (another process, minutes later). Two files of this one process within
    # one second would sort by N, where ".10" comes before ".9": the killed run's file is made a minute earlier.
    with pytest.MonkeyPatch.context() as earlier:
        earlier.setattr(time, "time", lambda: real_time() - 60)
        first = _tracker(tmp_path)
        for step in range(5):  # killed after step 4, its last checkpoint after step 2 (3 updates done)
            first.log({"loss": float(step)}, step)
        first.close()
    resumed = _tracker(tmp_path, resume_step=3)
    for step in range(3, 6):
        resumed.log({"loss": 10.0 + step}, step)
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(0, 0), (1, 1), (2, 2), (3, 13), (4, 14), (5, 15)]
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("loss")] == [(0, 0), (1, 1), (2, 2), (3, 13), (4, 14), (5, 15)]
    assert _tracker(tmp_path / "other").state_dict() == {"wandb_id": None}


def test_a_resumed_run_continues_its_wandb_run_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")  # no account, no network: W&B writes RUN/wandb/offline-run-*-ID
    monkeypatch.setenv("WANDB_SILENT", "true")
    first = _tracker(tmp_path, track=True)
    first.log({"loss": 1.0}, 0)
    saved = first.state_dict()  # what a checkpoint keeps
    first.close()
    # W&B names a session's directory offline-run-<second>-<id>: two sessions of one run within one second share it
    # (a real resume comes minutes later), so the second starts in the next second
    time.sleep(1.05 - time.time() % 1)
    resumed = _tracker(tmp_path, track=True, resume_step=1, wandb_id=saved["wandb_id"])
    resumed.log({"loss": 2.0}, 1)
    assert resumed.state_dict() == saved and resumed.wandb.id == saved["wandb_id"]
    resumed.close()
    runs = sorted((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(r.name.endswith(f"-{saved['wandb_id']}") for r in runs)  # two sessions, one run id


def test_a_combined_run_is_one_wandb_run_as_the_baselines(tmp_path, monkeypatch):
    """The reward model a policy run trains first, then PPO: one W&B run named train_policy__SEED__TIME holding the
    reward model's rows at its batch index and PPO's after them (batches + update, as the baseline's _step), with
    exp_name and task_id in its config; the policy's own config joins when PPO starts; each phase's metrics.jsonl
    keeps its own steps. A later policy run in the same process opens a W&B run of its own."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")

    def layout(kind, seed=1, first_phase=False):
        return WandbLayout("train_policy", "offline", seed, kind, first_phase=first_phase)

    reward = _tracker(tmp_path / "run" / "reward", track=True, layout=layout("reward", first_phase=True))
    for batch in range(3):
        reward.log({"train_reward/minibatch/loss": 1.0 + batch}, batch)
    reward.log({"train_reward/eval/accuracy": 0.5}, 3)  # after the last batch, at the batch count (train_reward.py)
    reward.close(next_step=3)
    policy = Tracker(tmp_path / "run", {"seed": 1, "ppo": {"lr": 1e-5}}, track=True, project="p", entity=None,
                     layout=layout("policy"))
    for update in range(2):
        policy.log({"ppo/objective/score": float(update)}, update)
    assert policy.state_dict() == {"wandb_id": reward.wandb.id, "wandb_step": 3}  # what a resumed PPO phase continues
    policy.close()
    other = _tracker(tmp_path / "other", track=True, layout=layout("policy", seed=2))  # nothing handed over now
    other.close()

    (run,) = offline_runs(tmp_path / "run")
    # where it began, the reward phase's directory, holds the whole run (docs/runs.md); RUN/wandb/ is never made
    assert [d.parent for d in (tmp_path / "run").rglob("offline-run-*")] == [tmp_path / "run" / "reward" / "wandb"]
    assert not (tmp_path / "run" / "wandb").exists()
    assert run.name.startswith("train_policy__1__") and run.group == "train_policy__offline"
    assert run.job_type == "reward_then_policy"
    assert run.config["exp_name"] == "train_policy" and run.config["task_id"] == "offline"
    assert run.config["ppo"] == {"lr": 1e-5} and run.config["train_reward"] == {"seed": 1}
    assert run.steps("train_reward/") == [0, 1, 2, 3] and run.steps("ppo/") == [3, 4]
    assert [r["step"] for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())] == [0, 1]
    (separate,) = offline_runs(tmp_path / "other")
    assert separate.id != run.id and separate.name.startswith("train_policy__2__") and separate.job_type == "policy"
