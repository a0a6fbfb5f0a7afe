"""Runs the tests compare: a stand-in training loop, and two runs that must be the same."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.run.lifecycle import Run

ROOT = Path(__file__).resolve().parents[2]


def fake_train(out: Path, updates: int = 4, **kw) -> list[float]:
    """What the policy script does with a Run, on a one-layer model: start (or resume), loop with logs and saves.
    -> the losses logged by this process."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(2, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    logged = []
    with Run(run_args(out, **kw), "policy", inputs=[], ranks=Ranks(1, 1)) as run:
        first = run.start({"seed": 1}, {"layer": layer, "optimizer": optimizer})
        for update in run.updates(first, updates, "policy"):
            optimizer.zero_grad()
            loss = layer(torch.ones(1, 2)).sum()
            loss.backward()
            optimizer.step()
            logged.append(loss.item())
            run.log({"loss": loss.item()}, step=update)
            end_of_update(run, update)
    return logged


def assert_same_run(one, two, model, exact=True):
    """Same metrics and weights: bit for bit when exact, else up to float32 summation order (see the tests)."""
    rows_one, rows_two = run_metrics(one), run_metrics(two)
    assert [r["step"] for r in rows_one] == [r["step"] for r in rows_two] and rows_one
    for a, b in zip(rows_one, rows_two):
        assert a.keys() == b.keys()
        for k in a:
            if k not in ("ppo/elapsed/time", "ppo/elapsed/fps"):
                assert b[k] == (a[k] if exact else pytest.approx(a[k], rel=1e-4, abs=1e-5)), (a["step"], k)
    w_one, w_two = load_file(Path(one) / model / "model.safetensors"), load_file(Path(two) / model / "model.safetensors")
    assert w_one.keys() == w_two.keys()
    for k in w_one:
        if exact:
            assert torch.equal(w_two[k], w_one[k]), k
        else:
            torch.testing.assert_close(w_two[k], w_one[k], atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------------------------------------ run directories
def run_args(out: Path, **kw) -> SimpleNamespace:
    """The run options `Run` reads (both scripts' RunArgs)."""
    base = dict(output_dir=str(out), resume=False, overwrite=False, track=False, wandb_project="p", wandb_entity=None,
                exp_name="train_policy", first_phase=False,
                task_name="t", seed=1, keep_checkpoints=1, save_interval=2)
    return SimpleNamespace(**{**base, **kw})


# ------------------------------------------------------------------------------ 1 vs 2 processes (torchrun, gloo)
def run_metrics(run_dir):
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def end_of_update(run: Run, update: int) -> None:
    """What the scripts' loops do after each update: agree on a stop, save when due or stopping, stop."""
    stopping = run.stop_requested(update)
    if run.checkpoint_due(update) or stopping:
        run.save_checkpoint(update)
    if stopping:
        run.stop_after(update)
