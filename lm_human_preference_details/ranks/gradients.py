"""The gradient of one optimizer step over the emulated ranks (FIDELITY E10 gradient averaging): each rank block's
backward pass, micro-batch by micro-batch, and the mean over every block of every process, with --exact-ranks added in
the ranks' binary tree (docs/ranks.md). The scripts call it as `Ranks.backward`; the blocks are `Ranks.blocks`.
"""

from __future__ import annotations

from typing import Callable, Iterable

import torch
import torch.distributed as dist


def backward(ranks, loss_fn: Callable[[slice], tuple[torch.Tensor, dict[str, torch.Tensor]]], n: int,
             params: Iterable[torch.nn.Parameter], micro_batches: Callable[[int], list[slice]]) -> dict[str, torch.Tensor]:
    """The gradient of one optimizer step over this process's ``n`` rows, as the original's ranks computed it.

    ``loss_fn(rows)`` -> (the mean loss over those rows, statistics of them), for a slice of the n rows. The rows
    are taken rank block by rank block (`Ranks.blocks`) and micro-batch by micro-batch; each block's gradient is the
    mean over its rows, and every parameter's .grad is left holding the mean over all ranks' blocks (FIDELITY E10
    gradient averaging, `BlockGradients`). -> each statistic per block, [blocks] (a rank's own mean when exact):
    `Ranks.mean_over_blocks` averages them as the original's mpi_allreduce_mean did.
    """
    gradients = BlockGradients(ranks, params)
    stats: dict[str, list[torch.Tensor]] = {}
    for block in ranks.blocks(n):
        size = block.stop - block.start
        sums: dict[str, torch.Tensor] = {}
        for part in micro_batches(size):
            rows = slice(block.start + part.start, block.start + part.stop)
            loss, row_stats = loss_fn(rows)
            weight = (part.stop - part.start) / size
            (loss * weight).backward()  # the block's loss is the mean over its rows
            for k, v in row_stats.items():
                sums[k] = sums.get(k, 0.0) + weight * v.detach().double()
        gradients.add()
        for k, v in sums.items():
            stats.setdefault(k, []).append(v)
    gradients.reduce()
    return {k: torch.stack(v) for k, v in stats.items()}


def average_gradients(params: Iterable[torch.nn.Parameter], world_size: int) -> None:
    """Replace each gradient by its mean over processes (FIDELITY E10 gradient averaging), in one flat all-reduce."""
    # OAI lm_human_preferences/utils/core.py: minimize, gradients mpi_allreduce_mean-ed across ranks
    if world_size == 1:
        return
    grads = [p.grad for p in params if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= world_size
    for g, new in zip(grads, flat.split([g.numel() for g in grads])):
        g.copy_(new.view_as(g))


def tree_add(stack: list[tuple[int, torch.Tensor]], x: torch.Tensor, spare: list[torch.Tensor] | None = None) -> None:
    """Push ``x`` onto a pairwise sum: equal-sized neighbours are added as they complete (a binary counter), so n
    pushes make a balanced binary tree of additions when n is a power of two, whatever pushes them.

    The sums are written into the left operand (`+=`: tensors the stack owns), and each right operand whose sum is
    taken goes to ``spare`` when given, for the caller to reuse: the same additions, no new tensor per sum.
    """
    count = 1
    while stack and stack[-1][0] == count:
        left_count, left = stack.pop()
        left += x
        if spare is not None:
            spare.append(x)
        x, count = left, left_count + count
    stack.append((count, x))


def tree_total(stack: list[tuple[int, torch.Tensor]]) -> torch.Tensor:
    """The sum of everything `tree_add` took (its last partial sums added right to left, into the left ones)."""
    total = stack.pop()[1]
    while stack:
        left = stack.pop()[1]
        left += total
        total = left
    return total


class BlockGradients:
    """The mean gradient over every block of every process, for one optimizer step (FIDELITY E10 gradient averaging).

    After each block's backward pass (its loss a mean over its own rows), `add()` takes the block's gradients;
    `reduce()` leaves the mean over all blocks of all processes in each parameter's .grad. Exact: block gradients
    are summed in the ranks' binary tree, across processes too (all-gathered, then added in the same tree), and
    divided by R. Not exact: one block per process, kept in .grad and all-reduced as a mean over processes.
    """

    def __init__(self, ranks, params: Iterable[torch.nn.Parameter]):
        self.ranks, self.params = ranks, [p for p in params if p.requires_grad]
        self.stack: list[tuple[int, torch.Tensor]] = []
        self.used = [False] * len(self.params)  # a parameter no block's loss reached keeps .grad None, as in one pass
        # flat gradients whose sums the tree has taken, reused for the next blocks: a fresh one per block (a [50257, 64]
        # embedding's included) was allocated and page-faulted in again each time
        self.spare: list[torch.Tensor] = []

    def add(self) -> None:
        """Take the gradients the last block's backward pass left in .grad (exact mode: and clear them)."""
        if not self.ranks.exact:
            return  # one block per process: its gradient stays in .grad
        grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in self.params]
        flat = torch.cat(grads, out=self.spare.pop()) if self.spare else torch.cat(grads)
        for i, p in enumerate(self.params):
            self.used[i] |= p.grad is not None
            p.grad = None
        tree_add(self.stack, flat, self.spare)

    def reduce(self) -> None:
        """Leave the mean over all blocks of all processes in .grad."""
        ranks = self.ranks
        if not ranks.exact:
            # OAI lm_human_preferences/utils/core.py: minimize, gradients mpi_allreduce_mean-ed across ranks
            average_gradients(self.params, ranks.world_size)
            return
        total = tree_total(self.stack)
        if ranks.world_size > 1:  # the processes' subtrees, added in the same tree one process would have built
            parts = [torch.empty_like(total) for _ in range(ranks.world_size)]
            dist.all_gather(parts, total)
            for part in parts:
                tree_add(self.stack, part)
            total = tree_total(self.stack)
        total /= ranks.num_ranks
        for p, g, used in zip(self.params, total.split([p.numel() for p in self.params]), self.used):
            p.grad = g.view_as(p) if used else None
