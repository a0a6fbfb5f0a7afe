"""--resume on other hardware: another number of torchrun processes, fewer GPUs, another device kind."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.processes import beside_its_pair, exact_policy

from lm_human_preference_details.ranks.emulated import set_generator_state
from lm_human_preference_details.run.identity import check_same_run
from lm_human_preference_details.utils.errors import UserError


# ------------------------------------------------------------------------------ generator states
def test_a_generator_state_of_another_device_kind_is_re_derived():
    """A CUDA generator's state (Philox: 16 bytes) restored into a CPU generator (5056 bytes), as a run saved on a GPU
    and resumed on the CPU: seeded from the saved bytes, the same every time, different for different states."""
    cuda_like = [torch.arange(16, dtype=torch.uint8), torch.arange(16, dtype=torch.uint8) + 1]
    draws = []
    for state in (cuda_like[0], cuda_like[0], cuda_like[1]):
        g = torch.Generator()
        set_generator_state(g, state)
        draws.append(torch.rand(4, generator=g))
    assert torch.equal(draws[0], draws[1]) and not torch.equal(draws[0], draws[2])
    same_kind = torch.Generator().manual_seed(5)
    torch.rand(3, generator=same_kind)
    g = torch.Generator()
    set_generator_state(g, same_kind.get_state())  # the same kind: taken as it is
    assert torch.equal(torch.rand(4, generator=g), torch.rand(4, generator=same_kind))


def test_world_size_and_device_may_change_on_resume_but_not_the_ranks():
    saved = {"world_size": 1, "device": "cuda", "num_ranks": 8, "ppo": {"lr": 1e-5}}
    check_same_run(saved, {**saved, "world_size": 2, "device": "cpu"})
    with pytest.raises(UserError, match=r"num_ranks 8 -> 4"):
        check_same_run(saved, {**saved, "num_ranks": 4})


# ------------------------------------------------------------------------------ 1 process <-> 2 torchrun processes
def interrupted_copy(run_dir: Path, into: Path) -> Path:
    """``run_dir`` as a run killed after its update-1 checkpoint: the update-2 one removed (the logs after it are
    dropped by --resume)."""
    shutil.copytree(run_dir, into)
    shutil.rmtree(into / "checkpoints" / "update_00000002")
    return into


def metrics(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in ("ppo/elapsed/time", "ppo/elapsed/fps")} for r in rows]


def test_a_run_saved_by_one_process_resumes_under_two_and_back(assets, exact_policy_runs, tmp_path):
    """A reward model, then 2 PPO updates with --exact-ranks, a checkpoint after each (helpers.processes.exact_policy),
    uninterrupted on 1 process and on 2 (the shared runs), then each resumed from its update-1 checkpoint on the other
    count: by 2 torchrun processes, and by 1 (in this process, as exact_policy runs it, while the pair runs:
    helpers.processes.beside_its_pair)."""
    (one, _), (two, _) = exact_policy_runs[1], exact_policy_runs[2]
    uninterrupted = metrics(one)
    assert [r["step"] for r in uninterrupted] == [0, 1] and metrics(two) == uninterrupted

    up = interrupted_copy(one, tmp_path / "one_then_two")  # saved by 1 process, resumed by 2
    down = interrupted_copy(two, tmp_path / "two_then_one")  # saved by 2 processes, resumed by 1
    beside_its_pair(exact_policy(assets, down, 1, "--resume"), exact_policy(assets, up, 2, "--resume"))
    assert metrics(up) == uninterrupted and metrics(down) == uninterrupted
    assert json.loads((up / "config.json").read_text())["world_size"] == 2
