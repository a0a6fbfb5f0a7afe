"""Seconds per PPO update: our update (train_policy.py) against a straightforward Hugging Face one.

    python benchmarks/speed.py                                        # CPU: tiny at batch 64, 124M at batch 8
    python benchmarks/speed.py --sizes 124m --batch-size 8 --repeats 2 --out runs/speed_cpu.md
    python benchmarks/speed.py --device cuda --batch-size 512 --out runs/speed_gpu.md
    python benchmarks/speed.py --device cuda --batch-size 512 --bf16 --out runs/speed_gpu_bf16.md

--bf16 (bfloat16 autocast) and --no-tf32 mean what they mean for train_policy.py and apply to both paths;
--compile is train_policy.py's --compile, for ours (the reference runs Hugging Face's own forward). On a GPU
the reference runs 128 episodes per forward pass (--reference-micro-batch-sequences): at 512 it runs out of 80 GB.

Both updates run in this process at the sentiment shape (query 64, response 24, 4 PPO epochs, 1 minibatch),
from the same initial weights, on the same queries, with the same seed:

  ours       train_policy.rollout (Policy.sample: a sampler with a preallocated KV cache that keeps log-probs and
             values from the sampling pass; the frozen reference's Policy.analyze_responses: LM head at the 24
             response positions only; RewardModel.score on the truncated responses), ppo.kl_rewards, then
             train_policy.ppo_epochs. Its GPT-2 forward passes skip the pads (lm_human_preference_details/language/gpt2.py).
  reference  what people write with Hugging Face: contexts left-padded, `lm.generate(do_sample=True, top_k=0,
             ...)`, then full forward passes of the policy (log-probs, values) and of the reference over
             [context, response] with full-vocabulary logits and log_softmax at every position, sliced to the
             response; the reward model's full forward (transformer + scalar head at every position, read at the
             last real token); then 4 PPO epochs, each a full forward with full-vocabulary logits at every
             position and the same losses (ppo.py's functions).

Both paths share the optimiser (TF1Adam) and the process's allocator setting (THP_MEM_ALLOC_ENABLE=1, as
train_policy.py sets it). Both do the same maths (the warm-up update checks it and the table's notes print the
differences). generate's
sampler draws differently from ours (the same distribution: temperature, top_k 0, no EOS stop), so the two
rollouts hold different tokens; the PPO phase of both is therefore timed on the SAME rollout tensors, ours.
Each phase is timed with time.perf_counter (after torch.cuda.synchronize on a GPU); the numbers are means
over --repeats updates after one warm-up update per path. Peak memory: torch.cuda.max_memory_allocated on a
GPU; on CPU the process's peak RSS (resource.getrusage), reset before each path where Linux allows it.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import resource
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Optional

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # as train_policy.py sets it, for both paths

import numpy as np
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere: train_policy.py sits at the repository root

import train_policy  # noqa: E402
from lm_human_preference_details.language.gpt2 import compile_blocks  # noqa: E402
from lm_human_preference_details.language.model import Policy, RewardModel  # noqa: E402
from lm_human_preference_details.language.tokenizer import N_VOCAB  # noqa: E402
from lm_human_preference_details.optim import TF1Adam, annealed_lr  # noqa: E402
from lm_human_preference_details.ppo import (  # noqa: E402
    apply_rejection,
    compute_advantages,
    kl_rewards,
    policy_loss,
    responses_pass_filter,
    truncate_responses,
    value_loss,
)
from lm_human_preference_details.ranks.devices import pick_device  # noqa: E402
from lm_human_preference_details.ranks.emulated import Ranks  # noqa: E402
from lm_human_preference_details.utils.errors import UserError  # noqa: E402
from lm_human_preference_details.utils.outputs import check_output_file, first_line_starts, new_or_ours  # noqa: E402

PAD = N_VOCAB  # [PAD] = 50257, right after GPT-2's real tokens (FIDELITY A1 plain-text tokens)
SIZES = {  # GPT-2 architecture, 50257 tokens, random initialisation
    "tiny": dict(n_layer=2, n_embd=128, n_head=2, n_positions=256),
    "124m": dict(n_layer=12, n_embd=768, n_head=12, n_positions=1024),  # GPT2Config's defaults = GPT-2 124M
    "774m": dict(n_layer=36, n_embd=1280, n_head=20, n_positions=1024),  # GPT-2 774M, the paper's model
}
PHASES = {"sample": "sample", "policy": "policy fwd", "reference": "reference fwd", "score": "reward fwd", "ppo": "PPO"}
EPISODES_PER_RUN = 1_000_000  # launch.py: ppo.total_episodes of the sentiment task
REFERENCE_GPU_MICRO_BATCH = 128  # the reference's episodes per forward pass on a GPU (512 ran out of an H100's 80 GB)


# ---------------------------------------------------------------------------------------------------------
# The straightforward reference update


def left_pad(tokens: torch.Tensor, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[b, t] tokens with pads anywhere -> ([b, t] input_ids with every pad moved to the left as 0, [b, t] attention mask)."""
    mask = tokens != pad_id
    order = torch.argsort(mask.to(torch.int8), dim=1, stable=True)  # pads first, real tokens keep their order
    return torch.gather(torch.where(mask, tokens, 0), 1, order), torch.gather(mask, 1, order).long()


def _positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """[b, t] 0/1 mask -> [b, t] position ids that count real tokens only (what generate does with left padding)."""
    return (attention_mask.cumsum(1) - 1).clamp(min=0)


def generate_kwargs(response_length: int, temperature: float, pad_id: int) -> dict:
    """`lm.generate` arguments for exactly response_length plain samples at a temperature (FIDELITY C1 plain sampling)."""
    # eos_token_id=None: EOS may be sampled and does not stop sampling. With GPT-2's EOS left in place,
    # min_new_tokens would mask EOS to -inf until the last token: a different distribution from the original's.
    return dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=response_length,
                min_new_tokens=response_length, pad_token_id=pad_id, eos_token_id=None)


@torch.no_grad()
def straightforward_generate(policy: Policy, contexts: torch.Tensor, attention_mask: torch.Tensor,
                             response_length: int) -> torch.Tensor:
    """[b, c] left-padded contexts and mask -> [b, response_length] responses sampled by Hugging Face generate."""
    out = policy.lm.generate(input_ids=contexts, attention_mask=attention_mask,
                             **generate_kwargs(response_length, policy.temperature, policy.pad_id))
    return out[:, contexts.shape[1]:]  # [b, response_length]


def straightforward_analyze(policy: Policy, contexts: torch.Tensor, attention_mask: torch.Tensor,
                            responses: torch.Tensor) -> dict[str, torch.Tensor]:
    """Log-probs, entropies and values [b, r] of responses after left-padded contexts, from full-vocabulary logits."""
    c = contexts.shape[1]
    query_responses = torch.cat([contexts, responses], dim=1)  # [b, c + r]
    mask = torch.cat([attention_mask, torch.ones_like(responses)], dim=1)  # [b, c + r]
    out = policy.lm(input_ids=query_responses, attention_mask=mask, position_ids=_positions(mask), output_hidden_states=True)
    logits = out.logits[..., : policy.n_vocab].float() / policy.temperature  # [b, c + r, V] at every position
    all_logprobs = F.log_softmax(logits, dim=-1)  # [b, c + r, V]
    logprobs = torch.gather(all_logprobs[:, c - 1 : -1], 2, responses.unsqueeze(-1)).squeeze(-1)  # [b, r]
    with torch.no_grad():  # logged only: no entropy bonus (FIDELITY E7 policy loss)
        lp = all_logprobs[:, c - 1 : -1]  # [b, r, V]
        entropies = -(lp.exp() * lp).sum(-1)  # [b, r]
    values = policy.head(out.hidden_states[-1][:, c - 1 : -1]).squeeze(-1).float()  # [b, r]
    return {"logprobs": logprobs, "entropies": entropies, "values": values}


def straightforward_score(reward_model: RewardModel, queries: torch.Tensor, query_mask: torch.Tensor,
                          responses: torch.Tensor) -> torch.Tensor:
    """[b, q] left-padded queries and mask, [b, r] responses (pads after truncation) -> [b] rewards at the last real token."""
    query_responses = torch.cat([queries, responses], dim=1)  # [b, q + r]
    mask = torch.cat([query_mask, (responses != reward_model.pad_id).long()], dim=1)  # [b, q + r]
    input_ids = torch.where(mask.bool(), query_responses, 0)
    h = reward_model.lm.base_model(input_ids=input_ids, attention_mask=mask, position_ids=_positions(mask)).last_hidden_state
    rewards = reward_model.head(h).squeeze(-1).float()  # [b, q + r], a reward at every position
    last = mask.shape[1] - 1 - mask.flip(1).argmax(1)  # [b] index of the last real token
    return reward_model.gain * rewards.gather(1, last[:, None]).squeeze(1) + reward_model.bias


@torch.no_grad()
def straightforward_rollout(policy: Policy, ref_policy: Policy, reward_model: RewardModel, queries: torch.Tensor,
                            contexts: torch.Tensor, args: train_policy.Args, timer: "PhaseTimer") -> dict[str, torch.Tensor]:
    """Sample with generate, then full forward passes of policy, reference and reward model; one micro-batch at a time."""
    task = args.task
    chunks = []
    for mb in torch.arange(len(queries)).split(args.micro_batch_sequences or len(queries)):
        ctx, ctx_mask = left_pad(contexts[mb], policy.pad_id)  # [m, c] each
        with timer("sample"):
            responses = straightforward_generate(policy, ctx, ctx_mask, task.response_length)
        with timer("policy"):
            out = straightforward_analyze(policy, ctx, ctx_mask, responses)
        with timer("reference"):
            ref_logprobs = straightforward_analyze(ref_policy, ctx, ctx_mask, responses)["logprobs"]
        postprocessed = truncate_responses(responses, task.truncate_token, task.truncate_after, policy.pad_id)
        with timer("score"):
            scores = straightforward_score(reward_model, *left_pad(queries[mb], policy.pad_id), postprocessed)
        scores = apply_rejection(scores, responses_pass_filter(postprocessed, task.truncate_token, task.truncate_after),
                                 task.penalty_reward_value)
        chunks.append({"responses": responses, "logprobs": out["logprobs"], "values": out["values"],
                       "ref_logprobs": ref_logprobs, "postprocessed_responses": postprocessed, "scores": scores})
    data = {k: torch.cat([c[k] for c in chunks]) for k in chunks[0]}
    data["contexts"], data["queries"] = contexts, queries
    return data


def straightforward_ppo_epochs(policy: Policy, optimizer: torch.optim.Optimizer, data: dict[str, torch.Tensor],
                               args: train_policy.Args, ranks: Ranks) -> list[dict[str, float]]:
    """noptepochs of PPO like train_policy.ppo_epochs, each minibatch a full forward with full-vocabulary logits."""
    ppo = args.ppo
    contexts, context_mask = left_pad(data["contexts"], policy.pad_id)  # [b, c] each
    stats = []
    for _ in range(ppo.noptepochs):
        for mb in train_policy.minibatch_indices(ranks, args):
            advantages, returns = compute_advantages(
                data["rewards"][mb], data["values"][mb], gamma=ppo.gamma, lam=ppo.lam,
                whiten_group_size=args.rank_minibatch_size, whiten_rewards=ppo.whiten_rewards)
            optimizer.zero_grad(set_to_none=True)
            mb_stats: dict[str, float] = {}
            micro = args.micro_batch_sequences or len(mb)
            for i in range(0, len(mb), micro):
                idx, part, weight = mb[i : i + micro], slice(i, i + micro), min(micro, len(mb) - i) / len(mb)
                with _autocast(policy.head.weight.device, args):  # a context per pass: the weights change at every step
                    out = straightforward_analyze(policy, contexts[idx], context_mask[idx], data["responses"][idx])
                vf_loss, vf_clipfrac = value_loss(out["values"], data["values"][idx], returns[part], ppo.cliprange_value)
                pg_loss, pg_clipfrac, approxkl = policy_loss(out["logprobs"], data["logprobs"][idx], advantages[part],
                                                             ppo.cliprange)
                loss = pg_loss + ppo.vf_coef * vf_loss
                (loss * weight).backward()
                for k, v in {"loss/policy": pg_loss, "loss/value": vf_loss, "loss/total": loss,
                             "policy/entropy": out["entropies"].mean(), "policy/approxkl": approxkl,
                             "policy/clipfrac": pg_clipfrac, "val/vpred": out["values"].mean(),
                             "val/error": ((out["values"] - returns[part]) ** 2).mean(), "val/clipfrac": vf_clipfrac}.items():
                    mb_stats[k] = mb_stats.get(k, 0.0) + weight * float(v.detach())
            optimizer.step()
            stats.append(mb_stats)
    return stats


# ---------------------------------------------------------------------------------------------------------
# Timing and memory


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class PhaseTimer:
    """Seconds per named phase, summed over calls; a GPU is synchronised before each clock reading."""

    def __init__(self, device: torch.device):
        self.device, self.seconds, self.cpu_seconds = device, {}, 0.0

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        _sync(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            _sync(self.device)
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def wrap(self, phase: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            with self(phase):
                return fn(*args, **kwargs)
        return timed


@contextmanager
def timed_methods(timer: PhaseTimer, methods: dict[str, tuple[object, str]]) -> Iterator[None]:
    """Time the methods train_policy.rollout calls ({phase: (object, method name)}) without changing what they do."""
    for phase, (obj, name) in methods.items():
        setattr(obj, name, timer.wrap(phase, getattr(obj, name)))  # an instance attribute shadows the method
    try:
        yield
    finally:
        for obj, name in methods.values():
            delattr(obj, name)


def reset_peak_memory(device: torch.device) -> bool:
    """Reset the peak counter; False when the process's peak RSS cannot be reset (then it is the peak so far)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # Linux: reset the resident-set high-water mark that getrusage reports
        return True
    except OSError:
        return False


def _cpu_seconds() -> float:
    """User + system CPU time of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def peak_memory(device: torch.device) -> int:
    """Bytes: torch.cuda.max_memory_allocated on a GPU, else the process's peak RSS."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def matmul_flops(config, queries: torch.Tensor, response_length: int, noptepochs: int) -> dict[str, int]:
    """FLOPs (2 per multiply-add) of one update's matrix products in each path, counted from the GPT-2 shapes.

    A backward pass counts twice its forward. Attention's own products (under 2% at these lengths) and the
    scalar heads are left out; ours' reward model is counted on untruncated responses (an upper bound).
    """
    d, ff, vocab = config.n_embd, config.n_inner or 4 * config.n_embd, config.vocab_size
    per_token = 2 * config.n_layer * (3 * d * d + d * d + 2 * d * ff)  # qkv, attention output, MLP: one token forward
    last_block_rest = 2 * (d * d + 2 * d * ff)  # the last block after its qkv, per row
    head = 2 * d * vocab  # the LM head at one position
    b, q = queries.shape
    r = response_length
    real = int((queries != PAD).sum())  # real query tokens in the batch
    # reference: generate (prefill with pads, r - 1 decode steps, the head at each new position), full forwards
    # with full-vocabulary logits at every position (policy, reference, each PPO epoch), the reward model's body
    full = b * (q + r) * (per_token + head)
    reference = (b * q + b * (r - 1)) * per_token + b * r * head + 2 * full + b * (q + r) * per_token + noptepochs * 3 * full
    # ours: the real tokens only; analyze_responses feeds [context, response[:-1]], its last block at r rows each
    fed = real + b * (r - 1)
    analyze = fed * per_token - (fed - b * r) * last_block_rest + b * r * head
    scored = real + b * r
    reward = scored * per_token - (scored - b) * last_block_rest  # the last block at one row each
    ours = fed * per_token + b * r * head + analyze + reward + noptepochs * 3 * analyze
    return {"ours": ours, "reference": reference}


# ---------------------------------------------------------------------------------------------------------
# The benchmark


def benchmark_args(batch_size: int, micro_batch_sequences: int, bf16: bool = False) -> train_policy.Args:
    """The sentiment preset at another batch size; whitening groups of the original's 8 ranks when they hold >= 8."""
    args = train_policy.build_args("sentiment")
    args.ppo.batch_size, args.ppo.nminibatches, args.ppo.noptepochs = batch_size, 1, 4
    if batch_size % args.num_ranks or batch_size // args.num_ranks < 8:
        args.num_ranks = 1  # a small benchmark batch: one emulated rank, one whitening group (same cost either way)
    args.micro_batch_sequences, args.bf16 = micro_batch_sequences, bf16
    return args.finalize(check_inputs=False)  # its models are built here, not read from --base-model


def make_queries(batch_size: int, query_length: int) -> torch.Tensor:
    """[batch_size, query_length] sentiment-style queries (A4 query processing: after the first '.', up to the last '.',
    right-padded)."""
    from lm_human_preference_details.language.tokenizer import gpt2_tokenizer
    from lm_human_preference_details.offline.corpus import corpus
    from lm_human_preference_details.queries import process_query

    tokenizer = gpt2_tokenizer()
    period = tokenizer.encode(".")[0]
    rows = []
    for text in corpus(2 * batch_size + 16, seed=0):
        q = process_query(tokenizer.encode(text), query_length=query_length, start_token=period, end_token=period,
                          pad_id=PAD)
        if q is not None:
            rows.append(q)
    if len(rows) < batch_size:
        raise RuntimeError(f"only {len(rows)} usable queries for a batch of {batch_size}")
    return torch.tensor(rows[:batch_size])


def build_models(size: str, temperature: float, device: torch.device, seed: int) -> tuple[Policy, Policy, RewardModel]:
    """Policy, frozen reference (a copy of the policy) and reward model, randomly initialised GPT-2s of one size."""
    from lm_human_preference_details.offline.pretrain import tiny_gpt2

    policy = Policy(tiny_gpt2(seed, **SIZES[size]), PAD, temperature)
    ref_policy = copy.deepcopy(policy).requires_grad_(False)
    reward_model = RewardModel(tiny_gpt2(seed + 1, **SIZES[size]), PAD).requires_grad_(False)
    return policy.to(device), ref_policy.to(device), reward_model.to(device)


def our_rollout(policy, ref_policy, reward_model, queries, args, timer, ranks: Ranks) -> dict[str, torch.Tensor]:
    """train_policy.rollout with its three model calls timed."""
    with timed_methods(timer, {"sample": (policy, "sample"), "reference": (ref_policy, "analyze_responses"),
                               "score": (reward_model, "score")}):
        return train_policy.rollout(policy, ref_policy, reward_model, queries, args, [], [], ranks, args.rewards.kl_coef)


def one_update(path: str, models, queries, args, initial: dict, device: torch.device, seed: int,
               ppo_data: Optional[dict] = None) -> tuple[dict, dict, list, PhaseTimer]:
    """One update of `path` ('ours' or 'reference') from the initial weights -> (rollout, PPO data, PPO stats, timer).

    The PPO phase runs on ``ppo_data`` when given (the other path's rollout), else on this path's own rollout.
    """
    policy, ref_policy, reward_model = models
    policy.load_state_dict(initial)
    # D5 TF-1 Adam, E8 lr decay
    optimizer = TF1Adam(policy.parameters(), lr=annealed_lr(args.ppo.lr, 0, args.n_updates), eps=1e-5)
    kl_coef = args.rewards.kl_coef
    timer = PhaseTimer(device)
    torch.manual_seed(seed)
    np.random.seed(seed)
    # the emulated ranks' sampling noise and permutations, and --exact-ranks, as train() has them
    ranks = Ranks(args.num_ranks, seed, device, exact=args.exact_ranks)
    cpu_start = _cpu_seconds()
    with timer("total"):
        with _autocast(device, args):  # as train_policy.train wraps the rollout
            if path == "ours":
                data = our_rollout(policy, ref_policy, reward_model, queries, args, timer, ranks)
            else:
                data = straightforward_rollout(policy, ref_policy, reward_model, queries, queries, args, timer)
        data["rewards"], data["non_score_reward"], _ = kl_rewards(data["scores"], data["logprobs"], data["ref_logprobs"],
                                                                  kl_coef)
        ppo_data = data if ppo_data is None else ppo_data
        ranks = Ranks(args.num_ranks, seed, device, exact=args.exact_ranks)  # the same permutations in both
        with timer("ppo"):  # autocast in each forward pass, as train_policy.ppo_epochs has it
            run_epochs = train_policy.ppo_epochs if path == "ours" else straightforward_ppo_epochs
            stats = run_epochs(policy, optimizer, ppo_data, args, ranks)
    timer.cpu_seconds = _cpu_seconds() - cpu_start
    return data, ppo_data, stats, timer


def _autocast(device: torch.device, args: train_policy.Args):
    """bfloat16 autocast with --bf16 (train_policy.autocast), else nothing."""
    return train_policy.autocast(args, device)


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float() - b.float()).abs().max().item()


def check_maths(models, initial: dict, ours: dict, ours_stats: list, ours_params: list, ref_stats: list,
                args: train_policy.Args) -> dict[str, float]:
    """The warm-up update's differences between the paths, on the same rollout (ours)."""
    policy, ref_policy, reward_model = models
    after = [p.detach().clone() for p in policy.parameters()]
    policy.load_state_dict(initial)
    before = [p.detach() for p in policy.parameters()]
    with torch.no_grad(), _autocast(policy.head.weight.device, args):
        ctx, ctx_mask = left_pad(ours["contexts"], PAD)
        out = straightforward_analyze(policy, ctx, ctx_mask, ours["responses"])
        ref = straightforward_analyze(ref_policy, ctx, ctx_mask, ours["responses"])
        scores = straightforward_score(reward_model, *left_pad(ours["queries"], PAD), ours["postprocessed_responses"])
    passed = responses_pass_filter(ours["postprocessed_responses"], args.task.truncate_token, args.task.truncate_after)
    ours_delta = torch.cat([(a - b).flatten() for a, b in zip(ours_params, before)])
    ref_delta = torch.cat([(a - b).flatten() for a, b in zip(after, before)])
    return {
        "logprobs (sampling pass vs full forward)": _max_diff(ours["logprobs"], out["logprobs"]),
        "values (sampling pass vs full forward)": _max_diff(ours["values"], out["values"]),
        "ref_logprobs": _max_diff(ours["ref_logprobs"], ref["logprobs"]),
        "scores (non-rejected)": _max_diff(ours["scores"][passed], scores[passed]) if passed.any() else 0.0,
        "PPO loss/total (every minibatch)": max(abs(a["loss/total"] - b["loss/total"]) for a, b in zip(ours_stats, ref_stats)),
        "parameter update, relative": _max_diff(ours_delta, ref_delta) / max(ours_delta.abs().max().item(), 1e-30),
    }


def bench_size(size: str, batch_size: int, repeats: int, device: torch.device, micro_batch_sequences: int,
               seed: int, bf16: bool = False, reference_micro_batch_sequences: Optional[int] = None,
               compile: bool = False) -> dict:
    """Warm up both paths once (checking their maths), then time `repeats` updates of each, alternating.

    ``reference_micro_batch_sequences`` (default: ``micro_batch_sequences``) lets the reference's full-vocabulary logits fit
    in memory; ``compile`` runs ours with --compile (the reference is Hugging Face's own forward).
    """
    load_before = os.getloadavg()[0]
    compile_blocks(compile)  # as train_policy.train does; the warm-up update below pays for the compilation
    args = benchmark_args(batch_size, micro_batch_sequences, bf16)
    path_args = {"ours": args, "reference": copy.copy(args)}
    if reference_micro_batch_sequences is not None:
        path_args["reference"].micro_batch_sequences = reference_micro_batch_sequences
    models = build_models(size, args.task.temperature, device, seed)
    initial = {k: v.detach().clone() for k, v in models[0].state_dict().items()}
    queries = make_queries(batch_size, args.task.query_length).to(device)
    print(f"[{size}] batch {batch_size}: warm-up and maths check ...", file=sys.stderr, flush=True)
    ours, _, ours_stats, _ = one_update("ours", models, queries, args, initial, device, seed)
    ours_params = [p.detach().clone() for p in models[0].parameters()]
    _, _, ref_stats, _ = one_update("reference", models, queries, path_args["reference"], initial, device, seed, ppo_data=ours)
    checks = check_maths(models, initial, ours, ours_stats, ours_params, ref_stats, args)
    flops = matmul_flops(models[0].lm.config, queries, args.task.response_length, args.ppo.noptepochs)
    del ours_params
    # ours' rollout is the same in every repeat (same weights, queries and seed): the reference's PPO phase reuses it
    results = {path: {"seconds": [], "cpu": [], "peak": 0, "peak_reset": True} for path in ("ours", "reference")}
    for r in range(repeats):
        for path in ("ours", "reference") if r % 2 == 0 else ("reference", "ours"):
            results[path]["peak_reset"] &= reset_peak_memory(device)
            _, _, _, timer = one_update(path, models, queries, path_args[path], initial, device, seed,
                                        ppo_data=ours if path == "reference" else None)
            results[path]["peak"] = max(results[path]["peak"], peak_memory(device))
            results[path]["seconds"].append(timer.seconds)
            phases = ", ".join(f"{PHASES.get(k, k)} {v:.2f}" for k, v in timer.seconds.items())
            results[path]["cpu"].append(timer.cpu_seconds)
            print(f"[{size}] repeat {r + 1}/{repeats} {path}: {phases} s; CPU {timer.cpu_seconds:.2f} s",
                  file=sys.stderr, flush=True)
    for res in results.values():
        runs = res.pop("seconds")
        res["phases"] = {k: float(np.mean([s.get(k, 0.0) for s in runs])) for k in [*PHASES, "total"]}
        res["phases"]["other"] = res["phases"]["total"] - sum(res["phases"][k] for k in PHASES)
        res["min_total"] = min(s["total"] for s in runs)
        res["cores_used"] = sum(res.pop("cpu")) / sum(s["total"] for s in runs)  # CPU time / wall time
    return {"size": size, "batch_size": batch_size, "repeats": repeats, "checks": checks, "results": results, "flops": flops,
            "load": (load_before, os.getloadavg()[0]),
            "noptepochs": args.ppo.noptepochs, "num_ranks": args.num_ranks, "compile": compile,
            "micro": {path: a.micro_batch_sequences for path, a in path_args.items()},
            "params": sum(p.numel() for p in models[0].parameters())}


def _fmt_bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def markdown_report(runs: list[dict], device: torch.device, repeats: int, bf16: bool = False) -> str:
    """The table (seconds per update per phase, ours and reference, ratio, peak memory) and notes."""
    gpu = device.type == "cuda"
    epochs = runs[0]["noptepochs"] if runs else 4
    cols = ["model", "batch", "path", *[PHASES[k] + (f" ×{epochs}" if k == "ppo" else "") for k in PHASES], "other",
            "total s/update (min)", "peak memory" + (" (allocated)" if gpu else " (process RSS)")]
    if gpu:
        cols.append(f"{EPISODES_PER_RUN // 1000}k-episode run")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for run in runs:
        res = run["results"]
        for path in ("ours", "reference"):
            ph = res[path]["phases"]
            peak = _fmt_bytes(res[path]["peak"]) + ("" if res[path]["peak_reset"] else " (peak so far)")
            row = [run["size"], str(run["batch_size"]), path,
                   *[("— (in sample)" if path == "ours" and k == "policy" else f"{ph[k]:.3f}") for k in PHASES],
                   f"{ph['other']:.3f}", f"**{ph['total']:.3f}** (min {res[path]['min_total']:.3f})", peak]
            if gpu:
                hours = math.ceil(EPISODES_PER_RUN / run["batch_size"]) * ph["total"] / 3600
                row.append(f"{hours:.2f} h")
            lines.append("| " + " | ".join(row) + " |")
        o, r = res["ours"]["phases"], res["reference"]["phases"]
        ratio = lambda k: f"{r[k] / o[k]:.2f}x" if o[k] > 0 else "—"  # noqa: E731
        row = [run["size"], str(run["batch_size"]), "reference / ours", *[ratio(k) for k in PHASES], "",
               f"**{ratio('total')}** (min {res['reference']['min_total'] / res['ours']['min_total']:.2f}x)",
               f"{res['reference']['peak'] / max(res['ours']['peak'], 1):.2f}x"]
        if gpu:
            row.append("")
        lines.append("| " + " | ".join(row) + " |")
    notes = [
        "",
        f"Seconds per PPO update (mean of {repeats} after one warm-up update per path), device {device}"
        + (f" ({torch.cuda.get_device_name(device)})" if gpu else f", {torch.get_num_threads()} torch threads")
        + f", torch {torch.__version__}; sentiment shape: query 64, response 24, {epochs} PPO epochs, 1 minibatch, "
        + ("bfloat16 autocast (--bf16) in both paths" if bf16 else "float32")
        + (f", TF32 matmuls {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}" if gpu else "") + ".",
        "- ours: train_policy.rollout (Policy.sample keeps log-probs and values from the KV-cached sampling pass, so it "
        "has no separate policy forward; Policy.analyze_responses runs the LM head at the 24 response positions only; "
        "GPT-2 forward passes over the real tokens only), kl_rewards, train_policy.ppo_epochs.",
        "- reference: left-padded contexts, HF `generate(do_sample=True, top_k=0, eos_token_id=None, max_new_tokens="
        "min_new_tokens=24)`, full forward passes with full-vocabulary logits + log_softmax at every position for the "
        "policy (log-probs, values) and the reference, the reward model's full forward, then PPO epochs with "
        "full-vocabulary logits at every position and ppo.py's losses.",
        "- generate's sampler draws other tokens than ours from the same distribution, so both PPO phases run on the "
        "SAME rollout tensors (ours). 'other' = truncation, rejection, KL rewards, padding and copying.",
        "- both paths: TF1Adam (a fused kernel), THP_MEM_ALLOC_ENABLE=1 (2 MiB pages for large CPU tensors).",
        "- peak memory: " + ("torch.cuda.max_memory_allocated, reset before each path." if gpu else
                             "the process's peak RSS during that path's updates (models of both paths stay loaded)."),
    ]
    if gpu:
        notes.append(f"- {EPISODES_PER_RUN // 1000}k-episode run = ceil(1e6 / batch) x total s/update (PPO updates "
                     "only; the original took ~4.8 h on 8 V100 for sentiment).")
    for run in runs:
        checks = ", ".join(f"{k} {v:.1e}" for k, v in run["checks"].items())
        if not gpu:
            res = run["results"]
            notes.append(f"- {run['size']}: this process used {res['ours']['cores_used']:.2f} (ours) and "
                         f"{res['reference']['cores_used']:.2f} (reference) of {os.cpu_count()} cores on average "
                         f"(CPU time / wall time; less than {torch.get_num_threads()} means other processes took "
                         f"cores); 1-minute load average {run['load'][0]:.2f} before, {run['load'][1]:.2f} after.")
        flops, res = run["flops"], run["results"]
        notes.append(f"- {run['size']}: matrix-product FLOPs per update, counted from the shapes (backward = 2 x forward; "
                     f"matmul_flops): ours {flops['ours'] / 1e12:.2f} TFLOP, reference {flops['reference'] / 1e12:.2f} "
                     f"TFLOP, ratio {flops['reference'] / flops['ours']:.2f}x (time ratio "
                     f"{res['reference']['phases']['total'] / res['ours']['phases']['total']:.2f}x); ours ran them at "
                     f"{flops['ours'] / res['ours']['phases']['total'] / 1e9:.0f} GFLOP/s.")
        micro = ", ".join(f"{path} {m or 'whole batch'}" for path, m in run["micro"].items())
        notes.append(f"- {run['size']}: episodes per forward pass: {micro}" + ("; ours with --compile (torch.compile)."
                                                                             if run["compile"] else "."))
        notes.append(f"- maths check, {run['size']} ({run['params'] / 1e6:.1f}M parameters), warm-up update on the same "
                     f"rollout, max |ours - reference|: {checks}.")
    return "\n".join(lines + notes) + "\n"


def default_reference_micro_batch(device: torch.device, batch_size: int, micro_batch_sequences: int) -> int:
    """The reference's episodes per forward pass: ``micro_batch_sequences`` when set; else on a GPU
    REFERENCE_GPU_MICRO_BATCH when the batch is a larger multiple of it; else 0 (the whole batch)."""
    n = REFERENCE_GPU_MICRO_BATCH
    if micro_batch_sequences or device.type != "cuda" or batch_size <= n or batch_size % n:
        return micro_batch_sequences
    return n


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="speed.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="+", choices=list(SIZES), default=["tiny", "124m"],
                   help="model sizes (default tiny 124m)")
    p.add_argument("--batch-size", nargs="+", type=int, default=None,
                   help="episodes per update, one for all sizes or one per size "
                        "(default: 64 tiny and 8 124m on CPU, 512 on a GPU)")
    p.add_argument("--repeats", type=int, default=2, help="timed updates per path after the warm-up (default 2)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto: cuda if available)")
    p.add_argument("--micro-batch-sequences", type=int, default=0,
                   help="episodes per forward pass in both paths, to fit memory (default 0: the whole batch)")
    p.add_argument("--reference-micro-batch-sequences", type=int, default=None,
                   help=f"episodes per forward pass in the reference path only (default: --micro-batch-sequences, or when "
                        f"that is 0, on a GPU, {REFERENCE_GPU_MICRO_BATCH} for a batch that is a larger multiple of it: "
                        f"the full-vocabulary logits of 512 episodes do not fit in 80 GB)")
    p.add_argument("--compile", action="store_true", help="ours with train_policy.py --compile (torch.compile)")
    p.add_argument("--bf16", action="store_true",
                   help="bfloat16 autocast around the rollout and the PPO epochs of both paths (train_policy.py --bf16)")
    p.add_argument("--no-tf32", action="store_true", help="on CUDA, full fp32 matmuls (train_policy.py --no-tf32)")
    p.add_argument("--seed", type=int, default=1, help="seed of the weights, queries, sampling and permutations (default 1)")
    p.add_argument("--out", default=None, help="also write the table to this markdown file")
    return p


def main(argv: Optional[list[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:  # a new file, or a table this script wrote: checked before anything runs (utils/outputs.py)
        out = args.out and check_output_file(args.out, flag="--out", ours=is_our_report, what="markdown file",
                                             writer="run of speed.py")
    except UserError as e:
        build_parser().exit(2, f"error: {e}\n")
    device = pick_device(args.device, tf32=not args.no_tf32)  # as train_policy.train sets up its device
    if args.batch_size is None:
        batch_sizes = [512 if device.type == "cuda" else (64 if s == "tiny" else 8) for s in args.sizes]
    elif len(args.batch_size) in (1, len(args.sizes)):
        batch_sizes = args.batch_size * len(args.sizes) if len(args.batch_size) == 1 else args.batch_size
    else:
        build_parser().error(f"--batch-size takes one value or one per size ({len(args.sizes)})")
    runs = []
    for size, b in zip(args.sizes, batch_sizes):
        reference_micro = args.reference_micro_batch_sequences
        if reference_micro is None:
            reference_micro = default_reference_micro_batch(device, b, args.micro_batch_sequences)
        for micro in (args.micro_batch_sequences, reference_micro):
            if micro and b % micro:
                build_parser().error(f"a micro-batch size ({micro}) must divide the batch size ({b})")
        runs.append(bench_size(size, b, args.repeats, device, args.micro_batch_sequences, args.seed, args.bf16,
                               reference_micro, args.compile))
    report = markdown_report(runs, device, args.repeats, args.bf16)
    print(report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        with new_or_ours(out, is_our_report) as tmp:  # never over a file this script did not write
            tmp.write_text(report)
        print(f"wrote {out}", file=sys.stderr)
    return 0


is_our_report = first_line_starts(b"| model | batch | path | sample |")  # a table this script wrote: a new run replaces it


if __name__ == "__main__":
    sys.exit(main())
