"""The emulated ranks: seeds, per-rank draws against a naive per-rank loop, and 1 vs 2 torchrun processes (gloo)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.assets import SHORT_TASK
from helpers.processes import beside_its_pair, in_process, started
from helpers.runs import assert_same_run

from lm_human_preference_details.language.model import Policy, load_lm
from lm_human_preference_details.queries import QuerySampler, make_query_sampler
from lm_human_preference_details.ranks.emulated import Ranks, held_ranks, rank_seed
from lm_human_preference_details.tasks import TaskHParams
from lm_human_preference_details.utils.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
PAD = 50257


def test_rank_seeds_and_shares_by_hand():
    assert [rank_seed(1, r) for r in range(3)] == [1, 100004, 200007]  # utils/core.py: seed + rank * 100003
    assert held_ranks(8, 1, 0) == range(0, 8)
    assert held_ranks(8, 2, 1) == range(4, 8) and held_ranks(8, 8, 3) == range(3, 4)
    with pytest.raises(UserError, match="3 processes cannot share 8 emulated ranks"):
        held_ranks(8, 3, 0)


def test_uniforms_are_each_ranks_own_draws_step_by_step():
    ranks = Ranks(3, seed=5)
    u = ranks.draws.uniforms(rows_per_rank=2, steps=4)  # [6, 4]
    for r in range(3):  # naive: rank r's generator, one draw of its 2 rows per sampling step
        g = torch.Generator().manual_seed(5 + r * 100003)
        expected = torch.cat([torch.rand(2, 1, dtype=torch.float64, generator=g) for _ in range(4)], dim=1)
        assert torch.equal(u[2 * r : 2 * r + 2], expected)


def test_sampler_draws_each_ranks_rows_from_its_generator(tiny_model_dir):
    torch.manual_seed(0)
    policy = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    contexts = torch.randint(0, PAD, (8, 6))
    contexts[1, 3:] = PAD
    ranks = Ranks(4, seed=11)  # 2 rows per rank
    out = policy.sample(contexts, 5, uniforms=ranks.draws.uniforms(2, 5))
    for r in range(4):  # naive: rank r alone samples its 2 rows with its own generator (the original's rank r)
        alone = policy.sample(contexts[2 * r : 2 * r + 2], 5, generator=torch.Generator().manual_seed(11 + r * 100003))
        assert torch.equal(out["responses"][2 * r : 2 * r + 2], alone["responses"])
        torch.testing.assert_close(out["logprobs"][2 * r : 2 * r + 2], alone["logprobs"], atol=1e-5, rtol=0)


def test_minibatch_permutations_are_each_ranks_numpy_stream():
    ranks = Ranks(2, seed=7)
    first, second = ranks.draws.minibatch_permutations(16), ranks.draws.minibatch_permutations(16)
    for r in range(2):  # the original: np.random.seed(seed + rank * 100003), then np.random.permutation per epoch
        np.random.seed(7 + r * 100003)
        assert first[r].tolist() == np.random.permutation(16).tolist()
        assert second[r].tolist() == np.random.permutation(16).tolist()


def test_label_rows_and_shared_permutation():
    ranks = Ranks(4, seed=2)
    assert ranks.rank_rows(torch.arange(10, 18)).tolist() == [10, 14, 11, 15, 12, 16, 13, 17]  # indices[r::4], r = 0..3
    np.random.seed(2)  # rank 0's draw, which the original broadcast to every rank
    assert ranks.draws.shared_permutation(12).tolist() == np.random.permutation(12).tolist()


def test_state_dict_restores_every_ranks_generators():
    ranks = Ranks(2, seed=3)
    ranks.draws.uniforms(4, 2), ranks.draws.minibatch_permutations(8)
    state = ranks.draws.state_dict()
    expected = ranks.draws.uniforms(4, 2), ranks.draws.minibatch_permutations(8)
    restored = Ranks(2, seed=99)
    restored.draws.load_state_dict(state)
    again = restored.draws.uniforms(4, 2), restored.draws.minibatch_permutations(8)
    assert torch.equal(expected[0], again[0]) and all((a == b).all() for a, b in zip(expected[1], again[1]))
    with pytest.raises(UserError, match="--num-ranks 2"):
        Ranks(4, seed=3).draws.load_state_dict(state)


def test_query_sampler_blocks_are_the_ranks_streams(tokenizer, assets):
    task = TaskHParams(query_dataset=str(assets / "queries.txt"), start_text=".", end_text=".")
    batch = next(make_query_sampler(tokenizer, task, batch_size=12, seed=0, num_ranks=4, ranks=[1, 3]))  # [6, 64]
    for i, r in enumerate([1, 3]):
        alone = QuerySampler(tokenizer, source=task.source, query_length=task.query_length, start_text=".",
                             end_text=".", batch_size=12, seed=0, num_ranks=4, ranks=[r])
        assert torch.equal(batch[3 * i : 3 * i + 3], next(alone))


NO_DISTRIBUTED = """
import sys, torch.distributed
torch.distributed.is_available = lambda: False  # a torch built without distributed support ...
sys.modules["torch.distributed.nn"] = None  # ... has no torch.distributed.nn: importing it fails
import train_policy, train_reward
from lm_human_preference_details.ranks.emulated import Ranks
print(Ranks(8, 1).held)
"""


def test_the_package_imports_on_a_torch_without_distributed_support():
    result = subprocess.run([sys.executable, "-c", NO_DISTRIBUTED], capture_output=True, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "range(0, 8)", result.stderr[-3000:]


def test_blocks_and_row_slices():
    exact, fused = Ranks(4, seed=0, exact=True), Ranks(4, seed=0)
    assert exact.blocks(8) == [slice(0, 2), slice(2, 4), slice(4, 6), slice(6, 8)] and fused.blocks(8) == [slice(0, 8)]
    by_three = lambda n: [slice(i, min(i + 3, n)) for i in range(0, n, 3)]  # noqa: E731
    assert exact.row_slices(16, by_three) == [slice(0, 3), slice(3, 4), slice(4, 7), slice(7, 8), slice(8, 11),
                                              slice(11, 12), slice(12, 15), slice(15, 16)]  # never across a rank
    assert fused.row_slices(8, by_three) == [slice(0, 3), slice(3, 6), slice(6, 8)]


def _combined_args(assets):
    """A policy run that trains its reward model first (2 batches of 16 labels), then 1 PPO update of 32 episodes;
    queries of 16 tokens, responses of 8 (SHORT_TASK)."""
    new = "--rewards.train-new-model."
    return ["--base-model", assets / "tiny-gpt2", f"{new}labels.source", assets / "short_labels.json",
            f"{new}labels.num-train", 32, f"{new}batch-size", 16, f"{new}lr", 1e-3, f"{new}rollout-batch-size", 32,
            f"{new}normalize-samples", 32, f"{new}eval-labels", 0, f"{new}seed", 3, "--task.query-dataset",
            assets / "queries.txt", *SHORT_TASK,
            "--ppo.total-episodes", 32, "--ppo.batch-size", 32, "--ppo.nminibatches", 2, "--ppo.noptepochs", 2,
            "--ppo.lr", 1e-3, "--ppo.no-whiten-rewards", "--num-ranks", 4, "--device", "cpu"]


def test_one_and_two_processes_give_the_same_run_bit_for_bit(exact_policy_runs):
    """--exact-ranks (the offline demo's default): a reward model, then 2 PPO updates, in one run on 1 process and on 2
    (torchrun, gloo), 4 emulated ranks, 1 CPU thread per process (helpers.fixtures.exact_policy_runs): identical metrics and
    weights of both phases, bit for bit.

    Each rank's share takes its own backward pass and its own statistics, and the ranks' gradients are added in one
    binary tree whichever process holds them, so the two runs add the same numbers in the same order. Without that
    (the next test) the sampler reads later draws from weights that differ at rounding level, and a token whose CDF
    boundary lies within 1e-7 of its uniform flips every few hundred draws, so long runs part ways.
    """
    (p1, _), (p2, two) = exact_policy_runs[1], exact_policy_runs[2]  # helpers.processes.exact_policy
    assert_same_run(p1 / "reward", p2 / "reward", "reward_model")
    assert json.loads((p2 / "reward" / "config.json").read_text())["world_size"] == 2
    assert_same_run(p1, p2, "policy")
    assert two.stdout.count("saved policy to") == 1  # only the main process prints and saves
    config = json.loads((p2 / "config.json").read_text())
    assert (config["world_size"], config["num_ranks"], config["exact_ranks"]) == (2, 4, True)


# a script under torchrun that also counts gloo's threads in each process: once the run has joined the process
# group (test_leaving...), and after its end, when it has left it
COUNT_GLOO = '''
import os, runpy, sys
from lm_human_preference_details.ranks import emulated as ranks

def gloo_threads():  # -1 where there is no /proc to count them in (the test that reads them is skipped there)
    if not os.path.isdir("/proc/self/task"):
        return -1
    return sum("gloo" in open(f"/proc/self/task/{t}/comm").read() for t in os.listdir("/proc/self/task"))

real_setup, joined = ranks.setup_distributed, []

def setup_and_count(device):
    device = real_setup(device)
    joined.append(gloo_threads())
    return device

ranks.setup_distributed = setup_and_count
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
print(f"process {os.environ['RANK']}: gloo threads {max(joined)} -> {gloo_threads()}")
'''


@pytest.fixture(scope="module")
def fused_runs(assets, tmp_path_factory) -> tuple[Path, Path, str]:
    """The combined run (`_combined_args`: a reward model, then PPO) without --exact-ranks on 1 process (in this one,
    helpers.processes.in_process) and on 2 (torchrun, gloo, micro-batches of 4 sequences, each process counting gloo's threads:
    COUNT_GLOO) -> (1-process run directory, 2-process one, the pair's stdout). One torchrun job for both phases and
    the threads' count (helpers.processes.started: torchrun's agent and workers as forks of this process)."""
    root = tmp_path_factory.mktemp("fused")
    (root / "count_gloo.py").write_text(COUNT_GLOO)
    _, pair = beside_its_pair(
        lambda: in_process("train_policy.py", *_combined_args(assets), "--output-dir", root / "one"),
        started(root / "count_gloo.py", 2, ROOT / "train_policy.py", *_combined_args(assets),
                "--micro-batch-sequences", 4, "--output-dir", root / "two"))
    return root / "one", root / "two", pair.stdout


def test_fused_ranks_match_up_to_summation_order(fused_runs):
    """Without --exact-ranks (the default): one backward pass per process, gradients all-reduced as a mean; the reward
    phase and PPO of one combined run (`fused_runs`).

    Tolerance: rel 1e-4, abs 1e-5 on every metric and weight. The processes add the same numbers in another order
    (two half-batch sums all-reduced instead of one sum; float32, ~1e-7 relative per step), so PPO is checked on one
    update (two epochs of two minibatches: four optimizer steps), before any sampled token can differ. The
    micro-batched two-process run also checks that micro-batches change only the summation order.
    """
    one, two, _ = fused_runs
    assert_same_run(one / "reward", two / "reward", "reward_model", exact=False)
    assert_same_run(one, two, "policy", exact=False)
    config = json.loads((two / "config.json").read_text())
    assert (config["world_size"], config["micro_batch_sequences"], config["exact_ranks"]) == (2, 4, False)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in Linux's /proc")
def test_leaving_the_process_group_ends_its_gloo_threads_after_a_model_load(fused_runs):
    """A process that left the group keeps none of gloo's threads (alive into the interpreter's exit, they can make a
    torchrun process die of SIGABRT there): ranks.py imports torch.distributed.nn first, so a model load cannot pin the
    group in that module's default arguments."""
    out = fused_runs[2]  # counted by COUNT_GLOO in the 2-process run, which loads its models in the group
    counts = sorted(re.findall(r"process (\d): gloo threads (\d+) -> (\d+)", out))
    assert [c[0] for c in counts] == ["0", "1"], out
    assert all(int(joined) > 0 and int(left) == 0 for _, joined, left in counts), out
