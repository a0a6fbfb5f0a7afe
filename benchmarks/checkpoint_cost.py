"""What checkpointing costs a GPT-2 124M policy run: time the training loop loses per save, bytes on disk, share of a
sentiment run.

    python benchmarks/checkpoint_cost.py --out /tmp/ckpt-bench

Saves what train_policy.py saves every --save-interval updates (the training checkpoint with the TF-1 Adam state, then
the Hugging Face policy directory) for a randomly initialised 124M policy, the way it saves it: `BackgroundSaver.save`
returns at once and a thread copies the state to CPU memory, then writes it. Per save, as train_policy.py's loop meets
it: a stand-in for a GPU run's training loop (small torch ops from Python, then a 1 ms wait) runs the next update's
rollout (--rollout-seconds, the H100's sample + reference + reward phases in benchmarks/results/speed_gpu.md), then
waits in `wait_copied` for the copy (its PPO epochs change the weights), then goes on while the thread writes. Measured,
medians of --repeats: the time `save` takes; the wait for the copy after the rollout; the stand-in's work lost while
the thread copied and wrote (the thread's CPU time and its hold on Python's GIL), and its longest step; and, for
comparison, the same save done without a thread. Reported against a sentiment run: 1954 updates of ~1.2 s on an H100
(docs/speed.md). The copy here is a memory copy on this machine's CPU; on a GPU box it is a DMA transfer to
page-locked memory on a CUDA stream of its own.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from pathlib import Path
from typing import Callable

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lm_human_preference_details.language.model import Policy, save_model_dir
from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
from lm_human_preference_details.optim import TF1Adam
from lm_human_preference_details.run.checkpoint import save_checkpoint, training_state
from lm_human_preference_details.run.saver import BackgroundSaver
from lm_human_preference_details.utils.errors import run_main
from lm_human_preference_details.utils.outputs import check_output_dir, claim_dir


def size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def loop_speed(running: Callable[[], bool]) -> tuple[float, float, float]:
    """The stand-in for a GPU run's training loop while ``running()``: a few small torch ops (kernel launches), then
    1 ms of sleep (waiting for the GPU) -> (steps per second, seconds run, longest step in seconds)."""
    x, steps, longest, t0 = torch.ones(256), 0, 0.0, time.perf_counter()
    while running():
        t = time.perf_counter()
        for _ in range(10):
            x = (x * 1.0001).add_(1e-4).clamp_(max=10.0)
        time.sleep(0.001)
        longest = max(longest, time.perf_counter() - t)
        steps += 1
    elapsed = time.perf_counter() - t0
    return steps / elapsed, elapsed, longest


def for_seconds(seconds: float) -> Callable[[], bool]:
    end = time.perf_counter() + seconds
    return lambda: time.perf_counter() < end


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--update-seconds", type=float, default=1.2)
    parser.add_argument("--updates", type=int, default=1954)
    parser.add_argument("--save-interval", type=int, default=50)
    parser.add_argument("--rollout-seconds", type=float, default=0.32,
                        help="the next update's rollout, which only reads the weights (H100: 0.205 + 0.069 + 0.049 s)")
    args = parser.parse_args()
    # a new or empty --out, marked as this benchmark's: its policy/ and checkpoints/ are replaced at each save
    claim_dir(check_output_dir(args.out, "checkpoint_cost", flag="--out", overwrite=False, noun="output"))
    tokenizer = gpt2_tokenizer()
    policy = Policy(GPT2LMHeadModel(GPT2Config()), tokenizer.pad_token_id, 0.7)
    optimizer = TF1Adam(policy.parameters(), lr=1e-5)
    for p in policy.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # the Adam moments exist, as after the first update
    objects = {"policy": policy, "optimizer": optimizer}

    def write_policy(copies, update, written):
        save_model_dir(args.out / "policy", copies["policy"], tokenizer, {"update": update})
        written.set()  # the last thing the thread does

    saver = BackgroundSaver(args.out, keep=1, models={"policy": policy})
    save_s, wait_s, lost_s, stall_s, sync_s = [], [], [], [], []
    for i in range(args.repeats):
        idle, _, _ = loop_speed(for_seconds(1.0))
        written = threading.Event()
        t = time.perf_counter()
        saver.save(i + 1, training_state(i + 1, objects), lambda copies: write_policy(copies, i + 1, written))
        save_s.append(time.perf_counter() - t)
        rollout, rollout_seconds, rollout_longest = loop_speed(for_seconds(args.rollout_seconds))  # the next rollout
        t = time.perf_counter()
        saver.wait_copied()  # the loop's PPO epochs change the weights
        wait_s.append(time.perf_counter() - t)
        during, seconds, longest = loop_speed(lambda: not written.is_set())
        saver.wait()
        # the loop's work not done while the thread copied and wrote
        lost_s.append(rollout_seconds * max(0.0, 1 - rollout / idle) + seconds * max(0.0, 1 - during / idle))
        stall_s.append(max(longest, rollout_longest))
    for i in range(args.repeats):  # the same save without a thread: what the loop would wait for
        t = time.perf_counter()
        save_checkpoint(args.out, 100 + i, training_state(100 + i, objects), keep=1)
        save_model_dir(args.out / "policy", policy, tokenizer, {"update": 100 + i})
        sync_s.append(time.perf_counter() - t)

    saving, waiting, lost, sync = (statistics.median(x) for x in (save_s, wait_s, lost_s, sync_s))
    run = args.updates * args.update_seconds
    saves = args.updates // args.save_interval + 1
    share = lambda s: f"{saves * s:.1f} s = {100 * saves * s / run:.2f}% of a {run:.0f} s sentiment run"  # noqa: E731
    print(f"{sum(p.numel() for p in policy.parameters()) / 1e6:.1f}M parameters; checkpoint "
          f"{size(args.out / 'checkpoints') / 2**30:.2f} GiB, policy directory {size(args.out / 'policy') / 2**30:.2f} GiB")
    print(f"per save, median of {args.repeats}: save() returns in {saving:.3f} s {[round(x, 3) for x in save_s]}; after a "
          f"{args.rollout_seconds} s rollout the loop waits {waiting:.3f} s for the copy {[round(x, 3) for x in wait_s]}; "
          f"the stand-in loop loses {lost:.2f} s {[round(x, 2) for x in lost_s]} while the thread copies and writes (its "
          f"longest step {1000 * max(stall_s):.0f} ms); without a thread the loop waits {sync:.2f} s "
          f"{[round(x, 2) for x in sync_s]}")
    print(f"{saves} saves: the loop blocked {share(saving + waiting)}; with the stand-in's losses "
          f"{share(saving + waiting + lost)}; without a thread {share(sync)}")


if __name__ == "__main__":
    run_main(main)
