"""run/lifecycle.py: the loop's calls (when a checkpoint is due, the agreed stop, the save before it, the stop itself)
and the optimizer waiting for a background save's copy of the weights."""

from __future__ import annotations

import signal

import pytest
import torch
from helpers.runs import end_of_update, run_args

from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.run.checkpoint import list_checkpoints
from lm_human_preference_details.run.lifecycle import Run
from lm_human_preference_details.utils.errors import Stopped


def started(out, **kw) -> tuple[Run, torch.nn.Module, torch.optim.Optimizer]:
    layer = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    run = Run(run_args(out, **kw), "policy", inputs=[], ranks=Ranks(1, 1)).__enter__()
    run.start({"seed": 1}, {"layer": layer, "optimizer": optimizer})
    return run, layer, optimizer


def test_a_checkpoint_is_due_every_save_interval_and_after_the_last_update(tmp_path):
    run, _, _ = started(tmp_path / "run", save_interval=2)
    try:
        due = [update for update in run.updates(0, 5, "policy") if run.checkpoint_due(update)]
    finally:
        run.__exit__(None, None, None)
    assert due == [1, 3, 4]  # after updates 2 and 4 (done % 2 == 0), and after the last, the fifth


def test_a_stop_signal_saves_after_its_update_and_stops_with_the_signals_status(tmp_path):
    """SIGTERM during update 1 (of 5, --save-interval 10): the loop saves the checkpoint after update 1, raises Stopped
    (128 + SIGTERM) naming it, and gives back the signal handlers it found."""
    before = signal.getsignal(signal.SIGTERM)
    run, _, _ = started(tmp_path / "run", save_interval=10)
    ran = []
    with pytest.raises(Stopped) as e:
        try:
            for update in run.updates(0, 5, "policy"):
                ran.append(update)
                if update == 1:
                    signal.raise_signal(signal.SIGTERM)  # only marks the stop while the loop runs
                end_of_update(run, update)
        finally:
            run.__exit__(None, None, None)
    assert ran == [0, 1] and e.value.exit_code == 128 + signal.SIGTERM
    assert [p.name for p in list_checkpoints(tmp_path / "run")] == ["update_00000002"]
    assert str(e.value).startswith("stopped by SIGTERM after update 1; saved ") and "update_00000002" in str(e.value)
    assert signal.getsignal(signal.SIGTERM) == before


def test_the_first_optimizer_step_after_a_save_waits_for_its_copy(tmp_path, monkeypatch):
    run, layer, optimizer = started(tmp_path / "run", save_interval=1)
    calls = []
    monkeypatch.setattr(run.saves.saver, "wait_copied", lambda: calls.append("waited"))
    try:
        for update in run.updates(0, 1, "policy"):
            run.save_checkpoint(update)  # its copy is taken in the background
            layer(torch.ones(1, 2)).sum().backward()
            optimizer.step()
            calls.append("stepped")
    finally:
        run.__exit__(None, None, None)
    assert calls == ["waited", "stepped"]


def test_a_saved_models_card_gets_the_runs_last_metrics_and_its_wandb_url(tmp_path):
    """What `card_facts` hands to a model's card: metrics.jsonl's last value of each metric, flushed first, and the W&B
    run's URL (none without --track)."""
    import types

    from lm_human_preference_details.run.lifecycle import card_facts

    run, _, _ = started(tmp_path / "run")
    try:
        run.log({"ppo/objective/score": 1.0, "ppo/objective/kl": 2.0}, step=0)
        run.log({"ppo/objective/score": 3.0}, step=1)
        assert card_facts(run.dir, run.tracker) == {"metrics": {"ppo/objective/score": 3.0, "ppo/objective/kl": 2.0},
                                                    "tracked": None}
        tracked = types.SimpleNamespace(flush=lambda: None, wandb=types.SimpleNamespace(url="https://wandb.ai/x/y/runs/z"))
        assert card_facts(run.dir, tracked)["tracked"] == "https://wandb.ai/x/y/runs/z"
        tracked.wandb.offline = True  # WANDB_MODE=offline: no URL, and W&B's warning not asked for
        assert card_facts(run.dir, tracked)["tracked"] is None
    finally:
        run.__exit__(None, None, None)
