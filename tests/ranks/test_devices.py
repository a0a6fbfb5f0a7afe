"""ranks/devices.py: --device auto on a box with no usable GPU, cuda:N made the current device (the CUDA probe faked), the
minibatch indices on the compute device, and an oai: reward model converted inside an agreement; --device
under torchrun, one GPU per process of a node."""

import contextlib
from types import SimpleNamespace

import pytest
import torch

import train_policy
from lm_human_preference_details.ranks import devices
from lm_human_preference_details.ranks import emulated as ranks
from lm_human_preference_details.ranks.devices import pick_device
from lm_human_preference_details.tasks import get_task
from lm_human_preference_details.utils.errors import UserError


def fake_probe(monkeypatch, cuda_build: str | None, gpu: bool) -> None:
    """torch as a CUDA build (``cuda_build``) or the CPU wheel, seeing one H100 or no GPU."""
    monkeypatch.setattr(torch.version, "cuda", cuda_build)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: int(gpu))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i=0: (9, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100")
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_90"])
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setattr(devices, "_said", set())


@pytest.mark.parametrize("cuda_build, why", [
    ("13.0", "is a CUDA 13.0 build but finds no usable GPU"),  # driver too old, or docker run without --gpus
    (None, "is a CPU-only build"),
])
def test_a_gpu_sized_task_refuses_the_cpu_fallback_in_one_line(monkeypatch, cuda_build, why):
    fake_probe(monkeypatch, cuda_build, gpu=False)
    args = train_policy.build_args("sentiment")  # --device auto by default
    with pytest.raises(UserError) as e:
        ranks.Ranks.start(args, get_task("sentiment").gpu_sized)
    message = str(e.value)
    assert "\n" not in message and why in message and "--task sentiment run takes days on a CPU" in message
    assert "pass --device cpu to train on the CPU anyway" in message


def test_device_cpu_insists_and_a_gpu_is_taken(monkeypatch):
    fake_probe(monkeypatch, "13.0", gpu=False)
    assert pick_device("cpu", gpu_sized="sentiment").type == "cpu"
    fake_probe(monkeypatch, "13.0", gpu=True)
    assert pick_device("auto", gpu_sized="sentiment").type == "cuda"


def test_the_offline_task_keeps_its_cpu_default(monkeypatch):
    fake_probe(monkeypatch, "13.0", gpu=False)
    assert not get_task("offline").gpu_sized
    assert all(get_task(name).gpu_sized for name in ("sentiment", "descriptiveness", "cnndm", "tldr"))
    args = train_policy.build_args("offline")
    assert ranks.Ranks.start(args, get_task("offline").gpu_sized).device == torch.device("cpu")


@pytest.mark.parametrize("name, expected", [("cuda:1", [torch.device("cuda", 1)]), ("cuda", []), ("cpu", [])])
def test_one_process_on_cuda_n_makes_it_the_current_device(monkeypatch, name, expected):
    fake_probe(monkeypatch, "13.0", gpu=True)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", calls.append)
    assert ranks.setup_distributed(torch.device(name)) == torch.device(name)
    assert calls == expected


def test_minibatch_indices_live_on_the_compute_device():
    """They index the rollout's tensors: on a GPU a CPU index would be a blocking copy per minibatch."""
    import numpy as np

    draws = SimpleNamespace(minibatch_permutations=lambda n: [np.random.RandomState(r).permutation(n) for r in (0, 1)])
    fake = SimpleNamespace(draws=draws, device=torch.device("meta"))
    args = SimpleNamespace(ppo=SimpleNamespace(batch_size=32), num_ranks=2, rank_minibatch_size=8)
    indices = train_policy.minibatch_indices(fake, args)
    assert len(indices) == 2 and all(i.device.type == "meta" and i.shape == (16,) for i in indices)


def test_an_oai_reward_model_is_converted_inside_an_agreement(monkeypatch):
    """Under torchrun, every process resolves oai:NAME (one converts under the cache entry's lock, files.cache_lock,
    while the others wait for it outside any collective), then they agree whether it failed anywhere."""
    events = []

    class FakeRanks:
        @contextlib.contextmanager
        def agree(self):
            events.append("enter")
            yield
            events.append("leave")

    def resolve(path):
        events.append(f"resolve {path}")
        raise UserError("stop here")  # what follows (loading the converted model) is not this test's

    monkeypatch.setattr(train_policy, "resolve_reward_model", resolve)
    args = train_policy.build_args("sentiment")
    args.rewards.trained_model = "oai:sentiment"
    with pytest.raises(UserError, match="stop here"):
        train_policy.get_reward_model(args, tokenizer=None, device="cpu", ranks=FakeRanks())
    assert events == ["enter", "resolve oai:sentiment"]  # the conversion ran inside the agreement


def under_torchrun(monkeypatch, gpus: int, per_node: int, nodes: int = 1) -> None:
    """torchrun's environment for process 0 of ``per_node`` processes on each of ``nodes`` nodes of ``gpus`` GPUs."""
    fake_probe(monkeypatch, "13.0", gpu=True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    for name, value in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", per_node * nodes), ("LOCAL_WORLD_SIZE", per_node)):
        monkeypatch.setenv(name, str(value))


@pytest.mark.parametrize("device, gpus, per_node, expected", [
    ("cuda:1", 2, 2, "--device cuda:1 puts all 2 processes of this node on GPU 1, which NCCL refuses: pass --device cuda"),
    ("cuda", 1, 2, "torchrun starts 2 processes on this node, one per GPU, but torch"),
    ("auto", 2, 4, "(2 GPUs): pass --nproc-per-node 2 or fewer"),
])
def test_torchrun_devices_that_cannot_work_are_one_line_before_any_process_group(monkeypatch, device, gpus, per_node,
                                                                                 expected):
    under_torchrun(monkeypatch, gpus, per_node)
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda *a, **k: pytest.fail("a process group"))
    monkeypatch.setattr(type(get_task("offline")), "prepare", lambda self: pytest.fail("the task's assets were built"))
    with pytest.raises(UserError) as e:
        train_policy.main(["--task", "offline", "--device", device])
    assert expected in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("device, gpus, per_node, nodes", [
    ("cuda", 2, 2, 1), ("auto", 8, 8, 1), ("cuda:1", 2, 1, 2),  # one process per node may take any GPU of its own
])
def test_torchrun_devices_with_a_gpu_per_process_pass(monkeypatch, device, gpus, per_node, nodes):
    under_torchrun(monkeypatch, gpus, per_node, nodes)
    devices.check_device(device)
