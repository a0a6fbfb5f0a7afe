"""Where the offline task's time goes: each phase's wall and CPU seconds, and its floor on the LM head.

    python benchmarks/offline_profile.py                  # the first run, from a fresh (temporary) $LMHP_CACHE
    python benchmarks/offline_profile.py --recipe         # also the recipe of the shipped assets (minutes)
    python benchmarks/offline_profile.py -- --ppo.total-episodes 640   # flags after -- go to train_policy.py

Runs `train_policy.main` in this process with timers around the functions each phase is made of (and, with
--recipe, `offline_assets.build_assets` first). A phase's seconds exclude the timed phases inside it. The floor of a phase
is the CPU time its passes over the 50,257-wide LM head would take at the measured matmul rate: 2 * d_model * 50,257
FLOPs per row for the forward product h @ W.T, twice that for a backward pass (the gradients of h and of W); the
rate is that of one [64, d_model] x [d_model, 50257] product, as lm_head.py runs it on a CPU, timed here first, per
CPU second (CPU seconds, unlike wall seconds, change little when other processes share the cores).
A benchmark, not a test: prints a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
import tempfile
import time
from pathlib import Path

START = time.perf_counter()
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as train_policy.py sets it
CACHE = tempfile.TemporaryDirectory()  # a fresh $LMHP_CACHE: the first run's work, before the package reads it
os.environ["LMHP_CACHE"] = CACHE.name
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import train_policy  # noqa: E402
import train_reward  # noqa: E402
from lm_human_preference_details import optim  # noqa: E402
from lm_human_preference_details.language import lm_head, model  # noqa: E402
from lm_human_preference_details.offline import assets as offline_assets  # noqa: E402
from lm_human_preference_details.offline import pretrain as offline_pretrain  # noqa: E402
from lm_human_preference_details.offline import task as offline_task  # noqa: E402
from lm_human_preference_details.ranks import emulated as ranks  # noqa: E402

IMPORTED = time.perf_counter()


class Profile:
    """Wall and CPU seconds and LM-head FLOPs per phase; a phase is the path of the timed calls it runs inside."""

    def __init__(self):
        self.stack: list[str] = []
        self.rows: dict[str, list[float]] = {}  # path -> [wall, cpu, head flops, calls], exclusive of inner phases

    def row(self) -> list[float]:
        return self.rows.setdefault(" / ".join(self.stack), [0.0, 0.0, 0.0, 0])

    @contextlib.contextmanager
    def phase(self, name: str):
        self.stack.append(name)
        self.row()[3] += 1
        wall, cpu = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            dwall, dcpu = time.perf_counter() - wall, time.process_time() - cpu
            row = self.row()
            row[0] += dwall
            row[1] += dcpu
            self.stack.pop()
            if self.stack:  # the parent's own time excludes this phase's
                parent = self.row()
                parent[0] -= dwall
                parent[1] -= dcpu

    def wrap(self, owner, attr: str, name: str) -> None:
        """Time every call of ``owner.attr`` as phase ``name``."""
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def timed(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)

        setattr(owner, attr, staticmethod(timed) if isinstance(owner.__dict__.get(attr), staticmethod) else timed)

    def count_head(self) -> None:
        """Add the FLOPs of every product with the LM head to the phase that runs it."""
        head_logits = lm_head.head_logits

        def counted(h, weight):
            self.row()[2] += 2 * h.shape[0] * weight.shape[0] * weight.shape[1]
            return head_logits(h, weight)

        lm_head.head_logits = counted
        backward = lm_head._ChunkedLogprobs.backward

        def counted_backward(ctx, *grads):
            h, weight = ctx.saved_tensors[:2]
            self.row()[2] += 2 * 2 * h.shape[0] * weight.shape[0] * weight.shape[1]  # grad of h and grad of W
            return backward(ctx, *grads)

        lm_head._ChunkedLogprobs.backward = staticmethod(counted_backward)


def head_rate(d: int = 64, vocab: int = 50257, rows: int = 64, seconds: float = 3.0) -> tuple[float, float]:
    """FLOP/s of one [rows, d] x [d, vocab] product as lm_head.head_logits runs it -> (per wall s, per CPU s)."""
    weight, h = torch.randn(vocab, d), torch.randn(rows, d)
    for _ in range(3):
        lm_head.head_logits(h, weight)
    n, wall, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - wall < seconds:
        lm_head.head_logits(h, weight)
        n += 1
    flops = 2 * rows * d * vocab * n
    return flops / (time.perf_counter() - wall), flops / (time.process_time() - cpu)


def instrument(p: Profile) -> None:
    """The phases: the functions each part of the task is made of."""
    p.wrap(offline_assets, "build_assets", "recipe")
    p.wrap(offline_assets, "pretrain", "pretraining")
    p.wrap(offline_pretrain, "response_logprobs", "full-softmax steps")  # pretrain's second phase
    p.wrap(offline_assets, "make_labels", "best-of-4 labels")
    p.wrap(offline_task, "ensure_offline_assets", "assets from the package")
    p.wrap(train_reward, "train", "reward model")
    p.wrap(train_reward, "reward_stats", "normalise (sampling)")
    p.wrap(train_reward, "label_loss", "forward")
    p.wrap(train_reward, "heldout_accuracy", "held-out accuracy")
    p.wrap(train_policy, "rollout", "PPO rollout")
    p.wrap(model.Policy, "sample", "sample")
    p.wrap(model.Policy, "analyze_responses", "policy forward")
    p.wrap(model.RewardModel, "score", "reward model score")
    p.wrap(train_policy, "ppo_epochs", "PPO epochs")
    p.wrap(ranks.Ranks, "backward", "backward")
    p.wrap(optim.TF1Adam, "step", "Adam")
    p.wrap(offline_task, "report", "report")
    p.count_head()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", action="store_true", help="first run the recipe of the shipped assets")
    parser.add_argument("extra", nargs="*", help="further train_policy.py flags, after --")
    args = parser.parse_args()
    rate, cpu_rate = head_rate()
    p = Profile()
    instrument(p)
    with tempfile.TemporaryDirectory() as tmp:
        if args.recipe:
            (Path(tmp) / "recipe").mkdir()
            offline_assets.build_assets(Path(tmp) / "recipe")
        with p.phase("run"):  # train_policy.py --task offline
            train_policy.main(["--task", "offline", "--output-dir", str(Path(tmp) / "run"), *args.extra])
    total = sum(r[0] for r in p.rows.values())
    print(f"\nimports {IMPORTED - START:.1f} s; LM-head product: {rate / 1e9:.1f} GFLOP/s per wall second, "
          f"{cpu_rate / 1e9:.1f} per CPU second ({torch.get_num_threads()} threads); load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| phase (its own time: inner phases apart) | calls | wall s | CPU s | LM-head GFLOP | floor, CPU s |")
    print("|---|---|---|---|---|---|")
    for path, (wall, cpu, flops, calls) in p.rows.items():
        print(f"| {path} | {calls} | {wall:.1f} | {cpu:.1f} | {flops / 1e9:.0f} | {flops / cpu_rate:.1f} |")
    flops = sum(r[2] for r in p.rows.values())
    print(f"| total | | {total:.1f} | {sum(r[1] for r in p.rows.values()):.1f} | {flops / 1e9:.0f} | {flops / cpu_rate:.1f} |")


if __name__ == "__main__":
    main()
