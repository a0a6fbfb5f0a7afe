"""run/saver.py: checkpoints written in a thread from a copy in CPU memory, while the training loop goes on."""

import errno
import os
import threading

import pytest
import torch

from lm_human_preference_details.run import checkpoint as ckpt
from lm_human_preference_details.run import saver as background
from lm_human_preference_details.run.checkpoint import check_finite, list_checkpoints, load_checkpoint
from lm_human_preference_details.utils.errors import UserError


class TiedLM(torch.nn.Module):
    """Input and output embeddings tied, as in GPT-2."""

    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.wte.weight


def test_copy_state_reuses_the_previous_copy():
    layer = torch.nn.Linear(2, 2)
    state = {"objects": {"layer": layer.state_dict()}, "groups": [{"lr": 0.1}], "rng": (3, (1, 2))}
    first = background.copy_state(state)
    assert first["groups"] == [{"lr": 0.1}] and first["groups"][0] is not state["groups"][0] and first["rng"] == (3, (1, 2))
    with torch.no_grad():
        layer.weight.add_(1.0)  # training goes on: the copy keeps the values it was taken with
    assert not torch.equal(first["objects"]["layer"]["weight"], layer.weight)
    second = background.copy_state(state, into=first)
    assert second["objects"]["layer"]["weight"] is first["objects"]["layer"]["weight"]  # the same memory, new values
    assert torch.equal(second["objects"]["layer"]["weight"], layer.weight)
    tied = background.copy_state(TiedLM().state_dict())
    assert tied["wte.weight"] is tied["head.weight"]  # copied once, still tied


def test_a_background_save_writes_the_state_of_its_update(tmp_path, monkeypatch):
    model = TiedLM()
    optimizer = torch.optim.Adam(model.parameters())
    model.head(model.wte(torch.tensor([1, 2]))).sum().backward()
    optimizer.step()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    release, real = threading.Event(), ckpt.write_state

    def slow_write(state, path):  # the thread writes only after training has changed the weights
        release.wait()
        real(state, path)

    monkeypatch.setattr(ckpt, "write_state", slow_write)
    saver = background.BackgroundSaver(tmp_path, keep=1, models={"model": model})
    written = {}
    path = saver.save(4, ckpt.training_state(4, {"model": model, "optimizer": optimizer}),
                      lambda copies: written.update({k: v.clone() for k, v in copies["model"].state_dict().items()}))
    saver.wait_copied()  # as the optimizer's pre-step hook before the PPO epochs change the weights
    with torch.no_grad():
        model.wte.weight.add_(1.0)  # the next update, while the thread writes
    release.set()
    saver.wait()
    assert path == list_checkpoints(tmp_path)[-1] == tmp_path / "checkpoints" / "update_00000004"
    saved = load_checkpoint(path)["objects"]["model"]
    for name in ("wte.weight", "head.weight"):
        assert torch.equal(saved[name], expected[name]) and torch.equal(written[name], expected[name])
    copy = saver.models["model"]
    assert copy.head.weight is copy.wte.weight and not copy.wte.weight.requires_grad  # tied, on the CPU, no gradients


def test_save_returns_before_the_copy_and_wait_copied_waits_for_it(tmp_path, monkeypatch):
    """The loop goes on (the next rollout only reads the weights) while the thread copies; wait_copied holds it
    until the copy is done, and the checkpoint holds the weights of the save, not the ones changed after."""
    release, real = threading.Event(), background.copy_state

    def slow_copy(*args, **kwargs):
        release.wait()
        return real(*args, **kwargs)

    monkeypatch.setattr(background, "copy_state", slow_copy)
    layer = torch.nn.Linear(3, 2)
    expected = layer.weight.detach().clone()
    saver = background.BackgroundSaver(tmp_path, keep=1)
    path = saver.save(1, ckpt.training_state(1, {"layer": layer}))  # returns with the copy not started
    waiter = threading.Thread(target=saver.wait_copied)
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # wait_copied waits for the copy
    release.set()
    waiter.join(10)
    assert not waiter.is_alive()
    with torch.no_grad():
        layer.weight.add_(1.0)  # the optimizer's step, after wait_copied
    saver.wait()
    assert torch.equal(load_checkpoint(path)["objects"]["layer"]["weight"], expected)


def test_a_failed_background_write_is_one_line_on_the_main_thread(tmp_path, monkeypatch):
    layer = torch.nn.Linear(2, 2)
    saver = background.BackgroundSaver(tmp_path, keep=1)
    good = saver.save(2, ckpt.training_state(2, {"layer": layer}))
    saver.wait()

    def full_disk(state, path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ckpt, "write_state", full_disk)
    saver.save(4, ckpt.training_state(4, {"layer": layer}))
    with pytest.raises(UserError) as e:
        saver.wait()
    assert str(e.value).startswith(f"cannot save {tmp_path / 'checkpoints' / 'update_00000004'} (No space left on device)")
    assert f"the last good checkpoint is {good}" in str(e.value) and "\n" not in str(e.value)
    assert list_checkpoints(tmp_path) == [good]
    saver.check()  # raised once


def test_a_loop_that_raises_still_completes_the_write(tmp_path, monkeypatch):
    layer, real, raised = torch.nn.Linear(2, 2), ckpt.write_state, threading.Event()

    def held_write(state, path):  # still writing when the loop raises: it begins only after that
        assert raised.wait(60)
        real(state, path)

    monkeypatch.setattr(ckpt, "write_state", held_write)
    saver = background.BackgroundSaver(tmp_path, keep=1)
    with pytest.raises(UserError, match="non-finite"):
        try:
            for update in range(5):
                if update == 1:
                    saver.save(2, ckpt.training_state(2, {"layer": layer}))
                if update == 2:
                    check_finite("update 2", loss=[float("nan")])
        finally:
            raised.set()
            saver.wait_quietly()  # what a Run does when its loop raises
    assert [p.name for p in list_checkpoints(tmp_path)] == ["update_00000002"]
