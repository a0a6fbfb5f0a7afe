"""ranks/gradients.py: each rank block's backward pass by micro-batches, and the mean over blocks in the ranks' tree."""

import pytest
import torch
from helpers.ppo import PAD, ppo_args, rollout_data

import train_policy
from lm_human_preference_details.language.model import Policy, load_lm
from lm_human_preference_details.optim import TF1Adam
from lm_human_preference_details.ranks.emulated import Ranks
from lm_human_preference_details.ranks.gradients import BlockGradients, backward, tree_add, tree_total


def test_tree_add_builds_a_balanced_binary_tree():
    class Term:  # records the additions as a string
        def __init__(self, text):
            self.text = text

        def __add__(self, other):
            return Term(f"({self.text}+{other.text})")

    def tree(n):
        stack = []
        for i in range(n):
            tree_add(stack, Term(str(i)))
        return tree_total(stack).text

    assert tree(1) == "0"
    assert tree(4) == "((0+1)+(2+3))"
    assert tree(8) == "(((0+1)+(2+3))+((4+5)+(6+7)))"
    assert tree(6) == "(((0+1)+(2+3))+(4+5))"  # not a power of two: the last partial sums, right to left
    # what a process holding ranks 4..7 of 8 sends is the right half of tree(8): the halves added as one tree
    assert f"({tree(4)}+{tree(4).translate(str.maketrans('0123', '4567'))})" == tree(8)


def test_exact_gradients_are_the_rank_means_in_the_tree_order():
    """Each rank's loss a mean over its rows; the step's gradient the mean over ranks, added as the tree says."""
    torch.manual_seed(0)
    x, w = torch.randn(16, 5), torch.nn.Parameter(torch.randn(5))
    unused = torch.nn.Parameter(torch.zeros(2))  # no loss reaches it: its .grad stays None, as after one pass
    ranks = Ranks(4, seed=0, exact=True)
    gradients = BlockGradients(ranks, [w, unused])  # what Ranks.backward accumulates into, block by block
    for block in ranks.blocks(16):
        (x[block] @ w).square().mean().backward()
        gradients.add()
        assert w.grad is None  # taken into the tree
    gradients.reduce()
    naive = [torch.autograd.grad((x[4 * r : 4 * r + 4] @ w).square().mean(), w)[0] for r in range(4)]  # rank r alone
    assert torch.equal(w.grad, ((naive[0] + naive[1]) + (naive[2] + naive[3])) / 4) and unused.grad is None
    torch.testing.assert_close(w.grad, torch.autograd.grad((x @ w).square().mean(), w)[0])  # = one pass, to rounding


def test_gradient_accumulation_gives_the_same_update(tiny_model_dir):
    results = []
    for micro in (0, 4):
        torch.manual_seed(0)
        policy = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
        torch.nn.init.normal_(policy.head.weight, std=0.1)
        data = rollout_data(policy)
        optimizer = TF1Adam(policy.parameters(), lr=1e-3)
        args = ppo_args(micro)
        stats = train_policy.ppo_epochs(policy, optimizer, data, args, Ranks(args.num_ranks, seed=0))
        results.append((stats, [p.detach().clone() for p in policy.parameters()]))
    (s_full, p_full), (s_micro, p_micro) = results
    for k in s_full[0]:
        assert s_full[0][k] == pytest.approx(s_micro[0][k], rel=1e-4, abs=1e-6), k
    for a, b in zip(p_full, p_micro):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("exact, block_x, grad", [(True, [2.0, 5.0], 3.5), (False, [3.5], 3.5)])
def test_backward_weighs_each_micro_batch_by_its_share_of_its_block(exact, block_x, grad):
    """Rows x = 1..6, loss mean(w x): a block's gradient is its mean x. Exact, 2 ranks: blocks 1..3 and 4..6, each in
    micro-batches of 2 rows and 1 (weights 2/3 and 1/3: 2/3 * 1.5 + 1/3 * 3 = 2, not the micro-batches' plain mean 2.25),
    then the mean of the blocks, (2 + 5) / 2. Fused: one block of 6 rows, micro-batches of 2 and 4 (1/3 * 1.5 + 2/3 *
    4.5 = 3.5)."""
    x, w = torch.arange(1.0, 7.0), torch.nn.Parameter(torch.tensor(2.0))
    stats = backward(Ranks(2, seed=0, exact=exact), lambda rows: ((w * x[rows]).mean(), {"x": x[rows].mean()}), 6, [w],
                     lambda n: [slice(0, 2), slice(2, n)])
    assert stats["x"].dtype == torch.float64 and stats["x"].tolist() == pytest.approx(block_x, rel=1e-6)
    assert w.grad.item() == pytest.approx(grad, rel=1e-6)
