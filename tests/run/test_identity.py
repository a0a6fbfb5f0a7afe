"""run/identity.py: what a resumed run may change, and the reward model's fingerprint that names it."""

import copy
import hashlib
import struct

import pytest
import torch
from torch import nn

from lm_human_preference_details.run.identity import check_same_run, fingerprint, flat_config
from lm_human_preference_details.utils.errors import UserError


def test_a_resumed_run_must_compute_the_same_thing():
    saved = {"seed": 1, "device": "cuda", "ppo": {"lr": 1e-5, "batch_size": 512}, "reward_model_fingerprint": "ab"}
    check_same_run(saved, {**saved, "device": "cpu", "resume": True})
    with pytest.raises(UserError, match=r"ppo.lr 1e-05 -> 0.001"):
        check_same_run(saved, {**saved, "ppo": {"lr": 1e-3, "batch_size": 512}})
    with pytest.raises(UserError, match="reward_model_fingerprint 'ab' -> 'cd'"):
        check_same_run(saved, {**saved, "reward_model_fingerprint": "cd"})


def test_options_are_compared_by_their_dotted_names_and_only_where_and_how_may_change():
    saved = {"seed": 1, "rewards": {"train_new_model": {"device": "cuda", "lr": 1e-5}}}
    assert flat_config(saved) == {"seed": 1, "rewards.train_new_model.device": "cuda", "rewards.train_new_model.lr": 1e-5}
    # a may-change option at any depth (the reward run's device), and one the checkpoint does not hold (track)
    check_same_run(saved, {"seed": 1, "rewards": {"train_new_model": {"device": "cpu", "lr": 1e-5}}, "track": True})
    check_same_run(saved, {**saved, "exp_name": "train_policy", "first_phase": False})  # W&B's names: a checkpoint
    # made before they were options resumes
    with pytest.raises(UserError, match=r"differ from the checkpoint's \(num_ranks None -> 8\); pass the same options"):
        check_same_run(saved, {**saved, "num_ranks": 8})  # an option the checkpoint does not hold may not appear
    changed = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "seed": 2}  # six differ: the first four, sorted, are shown
    with pytest.raises(UserError) as e:
        check_same_run(saved, {**saved, **changed})
    assert "(a None -> 1, b None -> 2, c None -> 3, d None -> 4); pass the same options" in str(e.value)
    assert "\n" not in str(e.value)


class Scaled(nn.Module):
    """One weight [1, 2] (float32) and one buffer [3] (int64): a fingerprint's bytes written out by hand."""

    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.tensor([1.0, 2.0]))
        self.register_buffer("count", torch.tensor([3]))


def test_the_fingerprint_is_the_sha256_of_each_tensors_name_and_bytes():
    model = Scaled()
    by_hand = b"weight" + struct.pack("<2f", 1.0, 2.0) + b"count" + struct.pack("<q", 3)  # state_dict order, little-endian
    assert fingerprint(model) == hashlib.sha256(by_hand).hexdigest()[:16]
    assert fingerprint(copy.deepcopy(model)) == fingerprint(model)  # the same weights: the same reward model
    flipped = copy.deepcopy(model)
    with torch.no_grad():
        flipped.weight.view(torch.int32)[1] ^= 1  # one bit of one weight: 2.0 -> the next float up
    assert flipped.weight[1].item() != 2.0 and fingerprint(flipped) != fingerprint(model)
    counted = copy.deepcopy(model)
    counted.count += 1  # a buffer counts too
    assert fingerprint(counted) != fingerprint(model)
