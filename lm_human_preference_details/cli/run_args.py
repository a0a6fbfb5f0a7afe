"""The run options both scripts take (RunArgs), their own checks, and the finalize tail both scripts share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import tyro

from lm_human_preference_details.ranks.devices import check_device
from lm_human_preference_details.ranks.emulated import check_seed
from lm_human_preference_details.tasks import TaskHParams, check_task, check_task_inputs, get_task
from lm_human_preference_details.utils.checks import check_at_least, check_output_dir, expand_home
from lm_human_preference_details.utils.errors import UserError


@dataclass
class RunArgs:
    """Options of a run that both scripts take (OAI train_reward.py: RunHParams, plus devices and tracking).

    A policy run that trains its own reward model hands all of them on (train_policy.reward_run_args). Each script's
    Args adds the ``task`` and ``base_model`` that finalize_run checks.
    """

    if TYPE_CHECKING:  # each script's Args has these fields; they are not run options (config.json keeps its order)
        task: TaskHParams
        base_model: str

    seed: int = 1
    """random seed; rank r uses seed + r * 100003 (utils/core.py: set_mpi_seed)"""
    num_ranks: int = 8
    """the original's MPI ranks (launch.py: 8 V100s), emulated on any number of processes (torchrun, a divisor):
    each has its own seed, query stream, sampling noise, minibatch permutations and whitening group"""
    exact_ranks: bool = False
    """each emulated rank takes its own forward and backward passes and statistics, added in a fixed tree;
    then 1, 2, 4 or 8 processes give bit-identical runs (with equal CPU threads per process).
    Its cost: a process runs one pass per rank it holds instead of one fused pass (measured in docs/ranks.md).
    Off: the same maths up to float summation order. On in the offline demo"""
    micro_batch_sequences: int = 0
    """query-response sequences per forward pass, to fit memory (0: all at once);
    a sampled query or an episode is one, a reward label one per candidate (4 for best_of_4);
    gradients are accumulated, the maths is unchanged"""
    output_dir: Optional[str] = None
    """run directory for logs and saved models (default runs/<reward|policy>_<task>_seed<seed>)"""
    device: str = "auto"
    """torch device: auto (cuda if available), cpu, cuda, cuda:1 ..."""
    tf32: bool = True
    """TF32 matmuls on CUDA (a numerics deviation from the original's fp32, README); --no-tf32 for full fp32"""
    compile: bool = False
    """torch.compile the GPT-2 blocks' layer norms, GELU and residual adds (same maths; a slow first update, docs/speed.md)"""
    track: bool = False
    """also log to Weights & Biases"""
    wandb_project: str = "lm-human-preferences"
    """W&B project"""
    wandb_entity: Optional[str] = None
    """W&B entity (team or user)"""
    exp_name: Optional[str] = None
    """the experiment's name in W&B, config exp_name (which openrlbenchmark selects runs by) and the W&B run's name's head;
    default: the script's name, train_policy or train_reward, as the baseline's"""
    resume: bool = False
    """continue the run in --output-dir from its last checkpoint (a reward model run: reuse it if finished, else train it);
    a directory without a run starts afresh, so a requeued job can always pass it"""
    overwrite: bool = False
    """delete the run already in --output-dir and start again (without --resume or this, such a directory is refused)"""
    keep_checkpoints: int = 1
    """training checkpoints kept in RUN/checkpoints, newest first;
    an older one is deleted only after a newer one is complete"""
    task_name: tyro.conf.Suppress[str] = "sentiment"
    first_phase: tyro.conf.Suppress[bool] = False
    """the reward model a policy run trains first: its W&B run is the policy run's, continued by PPO (tracking.py)"""
    world_size: tyro.conf.Suppress[int] = 1
    """processes the emulated ranks ran on (torchrun's WORLD_SIZE), recorded in config.json"""

    def check_run_options(self) -> None:
        """The run options' own values, each a one-line UserError; first, as a script then divides by --num-ranks."""
        check_at_least("--num-ranks", self.num_ranks, 1, "the number of emulated ranks")
        check_at_least("--micro-batch-sequences", self.micro_batch_sequences, 0,
                       "query-response sequences per forward pass (0: all)")
        if self.keep_checkpoints < 1:
            raise UserError(f"--keep-checkpoints ({self.keep_checkpoints}) must be at least 1")
        if self.resume and self.overwrite:
            raise UserError("--resume and --overwrite contradict each other; pass one of them")

    def finalize_run(self, kind: str, check_inputs: bool, labels_source: Optional[str], sequences_per_row: int = 1,
                     **sizes: int) -> None:
        """The end of both scripts' finalize, after their own checks and sizes: the task's numbers, then the task and
        the path flags resolved once; every rank's seed; --micro-batch-sequences holds whole rows (a row: an episode,
        or a label of ``sequences_per_row`` sequences) and divides each named size (in rows); the run directory
        (default runs/<kind>_<task>_seed<seed>), writable; the device. With ``check_inputs``, the task's local assets
        are built and what the flags name is read (the base model, the queries, ``labels_source``'s queries for
        oai-label-queries). All before anything loads, so a bad option ends in one line at once."""
        check_task(self.task)
        self.task = self.task.resolved()
        self.base_model = expand_home(self.base_model)
        check_seed(self.seed, self.num_ranks)  # E9 per-rank seeds: every rank's seed fits numpy
        micro = self.micro_batch_sequences
        if micro % sequences_per_row:
            raise UserError(f"--micro-batch-sequences ({micro}) must be a multiple of {sequences_per_row}: a label is "
                            f"{sequences_per_row} query-response sequences, scored together")
        for name, n in sizes.items():
            if micro and n % (micro // sequences_per_row):
                raise UserError(f"--micro-batch-sequences ({micro}) must hold a divisor of {name} ({n}) rows of "
                                f"{sequences_per_row} sequence(s); pick {sequences_per_row} x a divisor of {n}")
        if self.exp_name is None:  # decided here, so the reward run a policy run trains first inherits the policy's
            self.exp_name = f"train_{kind}"
        if self.output_dir is None:
            self.output_dir = f"runs/{kind}_{self.task_name}_seed{self.seed}"
        self.output_dir = expand_home(self.output_dir)  # the one value every check and write uses
        check_output_dir(self.output_dir)
        check_device(self.device)
        if check_inputs:
            get_task(self.task_name).prepare()  # a task's local assets, before their files are checked
            check_task_inputs(self.task, self.base_model, labels_source)

    def micro_batches(self, n: int, default: int | None = None, sequences_per_row: int = 1) -> list[slice]:
        """The slices of ``n`` rows (of ``sequences_per_row`` sequences each) that one forward pass takes at a time:
        --micro-batch-sequences, else ``default`` rows, else all."""
        size = self.micro_batch_sequences // sequences_per_row or default or n
        return [slice(i, min(i + size, n)) for i in range(0, n, size)]
