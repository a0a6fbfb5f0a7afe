"""The original's MPI ranks: R emulated ranks, each with its own seeds, spread over W torchrun processes.

The original ran as 8 MPI ranks; rank r seeded itself with seed + r * 100003, read its own query stream,
drew its own sampling noise and minibatch permutations, whitened its own minibatch, and all-reduced its
gradients and logged statistics (FIDELITY E9 per-rank seeds, E10 gradient averaging). `Ranks` is that set of ranks as seen from
one process:
torchrun's W processes (W divides R) each hold R / W consecutive ranks, process p ranks [p R / W, (p + 1) R / W).
A batch of the whole run is laid out rank by rank, so a process's rows are its ranks' blocks, in rank order.

    python train_policy.py ...                                  # W = 1: one process holds all R ranks
    torchrun --nproc-per-node 8 train_policy.py ...             # W = 8: one rank per GPU, as the original ran

With W = 1 every collective is skipped: nothing here costs a single-process run anything.

Exact ranks (`--exact-ranks`; the offline demo's default): each held rank's rows take their own forward and backward
passes and their own statistics, as each of the original's ranks did alone, and the ranks' gradients and statistics
are combined in an order fixed by the ranks alone (gradients.py: a balanced binary tree of the R ranks). W
processes then add exactly the numbers one process adds, in the same order, so W = 1, 2, 4 and 8 give bit-identical
runs when R / W is a power of two and each process uses the same number of CPU threads (a CPU kernel's sums depend on
its thread count; torchrun gives each of several processes OMP_NUM_THREADS=1). Off (the default), a process's ranks
share one fused backward pass and the processes all-reduce their mean: the same maths up to float summation order.
"""

from __future__ import annotations

import hashlib
from typing import Callable, Iterable

import numpy as np
import torch
import torch.distributed as dist

# Imported before any process group exists. torch.distributed.nn's functions take `group.WORLD` as a default argument,
# evaluated when the module is first imported; transformers imports it (through FSDP) while it loads a model, after
# init_process_group. Those defaults would then hold the world group, destroy_process_group could not free it, and its
# gloo threads would live on into the interpreter's exit, where a process can die of SIGABRT ("terminate called without
# an active exception") when the CPU is busy (docs/ranks.md, "Leaving the process group"). A torch built without
# distributed support has no such module (nor any process group): one process then runs as it always can.
if dist.is_available():
    import torch.distributed.nn  # noqa: F401

from lm_human_preference_details.ranks.devices import pick_device
from lm_human_preference_details.ranks.failures import AgreeOnFailures
from lm_human_preference_details.ranks.gradients import backward
from lm_human_preference_details.utils.errors import UserError
from lm_human_preference_details.utils.random_state import pack_numpy_state, unpack_numpy_state
from lm_human_preference_details.utils.torchrun import torchrun_world

SEED_STRIDE = 100003  # OAI lm_human_preferences/utils/core.py: set_mpi_seed, seed + rank * 100003


def rank_seed(seed: int, rank: int) -> int:
    """The seed of emulated rank ``rank`` (FIDELITY E9 per-rank seeds)."""
    # OAI lm_human_preferences/utils/core.py: set_mpi_seed
    return seed + rank * SEED_STRIDE


def seed_globals(seed: int) -> None:
    """Seed torch's and numpy's global generators with rank 0's seed: what builds a model (its random head) is then
    the same in every process; each rank's own draws come from its generators in `Ranks` (E9 per-rank seeds)."""
    torch.manual_seed(rank_seed(seed, 0))
    np.random.seed(rank_seed(seed, 0))


SEED_RANGE = (0, 2**32 - 1)  # what numpy's generators take


def check_seed(seed: int, num_ranks: int, flag: str = "--seed") -> None:
    """Every emulated rank's seed (rank_seed) fits numpy's generators, else one line naming ``flag``."""
    low, high = SEED_RANGE
    top = high - (num_ranks - 1) * SEED_STRIDE
    if not low <= seed <= top:
        raise UserError(f"{flag} is {seed}, but rank r seeds its generators with {flag} + r * {SEED_STRIDE}, which numpy "
                        f"takes in [{low}, {high}]; pass {flag} in [{low}, {top}] for {num_ranks} ranks")


def held_ranks(num_ranks: int, world_size: int, process: int) -> range:
    """The emulated ranks process ``process`` of ``world_size`` holds: a block of num_ranks / world_size."""
    if num_ranks % world_size:
        raise UserError(f"{world_size} processes cannot share {num_ranks} emulated ranks equally; run a number of "
                        f"processes that divides --num-ranks ({num_ranks}), or change --num-ranks")
    per_process = num_ranks // world_size
    return range(process * per_process, (process + 1) * per_process)


def setup_distributed(device: torch.device) -> torch.device:
    """Make ``device`` (cuda:N) the current CUDA device and join torchrun's process group (NCCL on CUDA, gloo on CPU)
    once; returns this process's device."""
    world_size, _, local_rank = torchrun_world()
    if world_size > 1 and device.type == "cuda" and device.index is None:  # one GPU per process on each node
        device = torch.device("cuda", local_rank)
    if device.type == "cuda" and device.index is not None:  # cuda:N is the current device: the saver's stream, events
        torch.cuda.set_device(device)  # and pinned memory belong to it, not to GPU 0
    if world_size == 1:
        return device
    if not dist.is_initialized():
        # env:// rendezvous: torchrun sets MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK (multi-node too)
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                device_id=device if device.type == "cuda" else None)
    return device


def shutdown_distributed() -> None:
    """Leave the process group, if this process joined one."""
    if dist.is_initialized():
        dist.destroy_process_group()


class Ranks(AgreeOnFailures):
    """The emulated ranks this process holds, the rows and blocks they take, and the collectives over processes; each
    rank's own random draws are `draws` (RankDraws); how the processes agree on a failure, `AgreeOnFailures`."""

    @classmethod
    def start(cls, args, gpu_sized: bool) -> "Ranks":
        """A run's ranks from its options (--num-ranks, --seed, --exact-ranks, --device): join torchrun's processes,
        seed the global generators with rank 0's seed in every process (so every process builds the same models), and
        record the number of processes in ``args.world_size``. ``gpu_sized``: the task's runs take days on a CPU, so
        --device auto refuses to fall back to it (Task.gpu_sized)."""
        seed_globals(args.seed)
        device = setup_distributed(pick_device(args.device, args.tf32, gpu_sized=args.task_name if gpu_sized else ""))
        ranks = cls(args.num_ranks, args.seed, device, exact=args.exact_ranks)
        args.world_size = ranks.world_size
        return ranks

    def __init__(self, num_ranks: int, seed: int, device: torch.device | str = "cpu", exact: bool = False):
        self.world_size, self.process, _ = torchrun_world()
        self.exact = exact
        if self.world_size > 1 and not dist.is_initialized():
            raise RuntimeError("call setup_distributed(device) before Ranks under torchrun")
        self.num_ranks, self.device = num_ranks, torch.device(device)
        self.held = held_ranks(num_ranks, self.world_size, self.process)
        self.draws = RankDraws(self, seed)  # each held rank's own random draws (E9 per-rank seeds)

    @property
    def is_main(self) -> bool:
        """Only process 0 logs, prints and saves (the original's rank 0)."""
        return self.process == 0

    def rank_rows(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows of a whole batch of ``indices`` that the held ranks take: rank r takes indices[r::R], in rank order."""
        # OAI lm_human_preferences/train_reward.py: RewardModelTrainer.train, all_ranks_indices[self.rank::self.num_ranks]
        return torch.cat([indices[r :: self.num_ranks] for r in self.held])

    # -------------------------------------------------------------------------- blocks: what one backward pass takes
    @property
    def blocks_per_process(self) -> int:
        """Backward passes (and statistics groups) per process: one per held rank when exact, else one."""
        return len(self.held) if self.exact else 1

    def blocks(self, n: int) -> list[slice]:
        """This process's n rows (its ranks' equal shares, in rank order) as blocks: each rank's share when exact."""
        size = n // self.blocks_per_process
        return [slice(i * size, (i + 1) * size) for i in range(self.blocks_per_process)]

    def row_slices(self, n: int, micro_batches: Callable[[int], list[slice]]) -> list[slice]:
        """The forward passes over this process's n rows: ``micro_batches`` of each block, never across two blocks.

        With --exact-ranks a rank's rows are computed alone, as the original's rank computed them, so every kernel sees
        the same shapes on any number of processes (a CPU matmul of 8 rows, or an attention of another width, can
        round differently from one of 64; our packed forward sizes its attention by the longest row it holds).
        """
        return [slice(b.start + p.start, b.start + p.stop) for b in self.blocks(n) for p in micro_batches(b.stop - b.start)]

    def gather_blocks(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """``x`` with this process's blocks along ``dim``, concatenated with every process's, in rank order."""
        if self.world_size == 1:
            return x
        parts = [torch.empty_like(x, device=self.device) for _ in range(self.world_size)]
        dist.all_gather(parts, x.to(self.device).contiguous())
        return torch.cat(parts, dim=dim).to(x.device)

    def mean_over_blocks(self, x: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """The mean over every process's blocks along ``dim``: per rank, as the original's mpi_allreduce_mean, when exact."""
        # OAI lm_human_preferences/utils/core.py: mpi_allreduce_mean of each rank's own statistics
        return self.gather_blocks(x, dim).mean(dim)

    # -------------------------------------------------------------------------- collectives (no-ops for W = 1)
    def sum(self, x: torch.Tensor) -> torch.Tensor:
        """The sum of ``x`` over processes."""
        if self.world_size == 1:
            return x
        y = x.to(self.device, copy=True)  # NCCL reduces GPU tensors only
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
        return y.to(x.device)

    def from_main(self, value):
        """Process 0's ``value`` (any picklable object), on every process."""
        if self.world_size == 1:
            return value
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def backward(self, loss_fn: Callable[[slice], tuple[torch.Tensor, dict[str, torch.Tensor]]], n: int,
                 params: Iterable[torch.nn.Parameter], micro_batches: Callable[[int], list[slice]]) -> dict[str, torch.Tensor]:
        """The gradient of one optimizer step over this process's ``n`` rows, as the original's ranks computed it
        (gradients.backward): -> each statistic of ``loss_fn(rows)`` per block, [blocks]."""
        return backward(self, loss_fn, n, params, micro_batches)

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Process 0's weights and buffers everywhere, so every process starts from the same model."""
        # OAI lm_human_preferences/train_policy.py: sync_models (utils.variable_synchronizer from rank 0)
        if self.world_size == 1:
            return
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)

    def barrier(self) -> None:
        """Wait until every process gets here."""
        if self.world_size > 1:
            dist.barrier()


class RankDraws:
    """Each held rank's own random draws (FIDELITY E9 per-rank seeds): rank r's sampling noise from a torch generator
    on the run's device, its permutations from numpy's legacy state (RandomState(s).permutation(n) is what
    np.random.seed(s); np.random.permutation(n) gave the original), both seeded with rank_seed(seed, r); and their
    checkpoint state, every rank's, gathered from every process."""

    def __init__(self, ranks: Ranks, seed: int):
        self.ranks, self.seed = ranks, seed
        self.torch_generators = [torch.Generator(ranks.device).manual_seed(rank_seed(seed, r)) for r in ranks.held]
        self.numpy_generators = [np.random.RandomState(rank_seed(seed, r)) for r in ranks.held]

    def uniforms(self, rows_per_rank: int, steps: int) -> torch.Tensor:
        """[held * rows_per_rank, steps] float64 uniforms: rank r's rows from rank r's generator, step by step.

        Column t of rank r's block is the t-th draw of rows_per_rank numbers from its generator, so a micro-batch
        of any rows reads the numbers the full batch would, and rank r alone with its generator draws them too.
        """
        blocks = [torch.rand(steps, rows_per_rank, dtype=torch.float64, generator=g, device=self.ranks.device).t()
                  for g in self.torch_generators]  # [rows_per_rank, steps] each
        return torch.cat(blocks)

    def minibatch_permutations(self, rows_per_rank: int) -> list[np.ndarray]:
        """One epoch's permutation of each held rank's rows, from that rank's numpy generator."""
        # OAI lm_human_preferences/train_policy.py: PPOTrainer.train, np.random.permutation per rank per epoch
        return [g.permutation(rows_per_rank) for g in self.numpy_generators]

    def shared_permutation(self, n: int) -> np.ndarray:
        """A permutation of n drawn by rank 0 and given to every process (the original's comm.bcast)."""
        # OAI lm_human_preferences/train_reward.py: RewardModelTrainer.train, comm.bcast(np.random.permutation(n))
        permutation = [self.numpy_generators[0].permutation(n) if self.ranks.is_main else None]
        if self.ranks.world_size > 1:
            dist.broadcast_object_list(permutation, src=0)
        return permutation[0]

    def state_dict(self) -> dict:
        """Every emulated rank's generator states (gathered from all processes), keyed by rank."""
        local = {r: {"torch": g.get_state(), "numpy": pack_numpy_state(n.get_state())}
                 for r, g, n in zip(self.ranks.held, self.torch_generators, self.numpy_generators)}
        if self.ranks.world_size > 1:
            gathered: list = [None] * self.ranks.world_size
            dist.all_gather_object(gathered, local)
            local = {r: s for part in gathered for r, s in part.items()}
        return {"num_ranks": self.ranks.num_ranks, "seed": self.seed, "ranks": local}

    def load_state_dict(self, state: dict) -> None:
        """Restore the held ranks' generators from `state_dict` (saved with any number of processes)."""
        if state["num_ranks"] != self.ranks.num_ranks:
            raise UserError(f"the checkpoint has {state['num_ranks']} emulated ranks, this run {self.ranks.num_ranks}; "
                            f"pass --num-ranks {state['num_ranks']}")
        for r, g, n in zip(self.ranks.held, self.torch_generators, self.numpy_generators):
            set_generator_state(g, state["ranks"][r]["torch"])
            n.set_state(unpack_numpy_state(state["ranks"][r]["numpy"]))


def set_generator_state(generator: torch.Generator, saved: torch.Tensor) -> None:
    """Restore a torch generator's saved state, saved on this kind of device or another (docs/checkpoints.md).

    The same kind (CPU: Mersenne Twister, 5056 bytes; CUDA: Philox seed and offset, 16 bytes) takes it as it is. A CPU
    state cannot become a CUDA one or back (the two draw different streams from one seed), so the generator is seeded
    from the saved state's bytes instead: a resumed run moved to other hardware draws new noise, the same on every
    resume of that checkpoint there, and each rank its own.
    """
    if saved.numel() == generator.get_state().numel():
        generator.set_state(saved)
        return
    digest = hashlib.sha256(saved.cpu().numpy().tobytes()).digest()
    generator.manual_seed(int.from_bytes(digest[:8], "little") >> 1)  # 63 bits: any generator's seed
