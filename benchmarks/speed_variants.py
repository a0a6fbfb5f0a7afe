"""Before and after: our PPO update (benchmarks/speed.py's) under each speed switch, side by side in one process.

    python benchmarks/speed_variants.py --device cuda --out runs/variants.md        # 124M at batch 512, then 774M
    python benchmarks/speed_variants.py --device cpu --sizes tiny --batch-size 8 --repeats 1 --large none  # any machine

The switches (module attributes; 'after' is the package's default):
  aligned head      lm_head.GPU_VOCAB_MULTIPLE: 64 pads the LM head's products to 50304 rows, 1 leaves 50257 (before)
  kept softmax      lm_head.GPU_KEEP_PROBS_ELEMENTS: 2**30 keeps batch 512's softmax for the backward pass, 2**27
                    recomputes it (before)
  CUDA graph        step_graph.ENABLED: the sampler's token steps replayed as one CUDA graph (language/step_graph.py)
  decode attention  gpt2.DECODE_ATTENTION: 'auto' (two float32 batched products on a GPU, SDPA on a CPU: the
                    default), 'sdpa' (PyTorch's fused kernel everywhere: before) or 'products'
On a CPU none of them applies (the head is not padded, no graph): the table shows the steps, not a difference.

Each variant updates from the same weights, queries and seed; one warm-up update each (graph captures included),
then --repeats updates each, the variants taking turns. Every variant's rollout log-probs and PPO losses are
compared with 'before' (a graph must give exactly the eager loop's numbers; the padded head moves TF32 rounding).
Then: torch.profiler over one update of the defaults, by kernel class; the floors measured here (TF32 matrix rate
on the head's shapes, aligned and not, and the copy bandwidth); the rollout's tokens per second against its
roofline; the whole update against its matrix FLOPs; and --large (GPT-2 774M's shapes) at batch 512 with the
largest --micro-batch-sequences that fits. A benchmark, not a test: nothing asserts.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path
from typing import Iterator, Optional

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # run as a script from anywhere: the package and benchmarks/ sit at the repository root

from benchmarks import speed  # noqa: E402
from lm_human_preference_details.language import gpt2, lm_head, step_graph  # noqa: E402
from lm_human_preference_details.ranks.devices import pick_device  # noqa: E402
from lm_human_preference_details.utils.errors import UserError  # noqa: E402
from lm_human_preference_details.utils.outputs import check_output_file, first_line_starts, new_or_ours  # noqa: E402

BEFORE = dict(multiple=1, keep=2**27, graph=False, attention="sdpa")
# name, switches, the seconds per update it should save against 'before' at 124M, batch 512, on an H200, predicted
# before measuring (docs/speed.md: the head's chunked passes at ~0.25 s, the decode steps launch-bound at ~0.17 s)
VARIANTS = [
    ("before", BEFORE, 0.0),
    ("aligned head", {**BEFORE, "multiple": 64}, 0.10),
    ("aligned head + kept softmax", {**BEFORE, "multiple": 64, "keep": 2**30}, 0.12),
    ("CUDA graph", {**BEFORE, "graph": True}, 0.10),
    ("aligned head + kept softmax + CUDA graph", {**BEFORE, "multiple": 64, "keep": 2**30, "graph": True}, 0.22),
    # predicted after the first measurement, whose profile showed SDPA's float32 kernel at 0.41 ms a decode step
    # (113 ms of a 191 ms sampling pass) and 'products' measured in a graph captured with SDPA (since fixed)
    ("after (the defaults)", dict(multiple=64, keep=2**30, graph=True, attention="auto"), 0.32),
]
TF32_DENSE_TFLOPS = 494.7  # H100 / H200 SXM datasheet, dense TF32 tensor-core rate (sparsity off)


@contextlib.contextmanager
def switches(multiple: int, keep: int, graph: bool, attention: str) -> Iterator[None]:
    """The four speed switches set for the duration, then put back."""
    saved = (lm_head.GPU_VOCAB_MULTIPLE, lm_head.GPU_KEEP_PROBS_ELEMENTS, step_graph.ENABLED, gpt2.DECODE_ATTENTION)
    lm_head.GPU_VOCAB_MULTIPLE, lm_head.GPU_KEEP_PROBS_ELEMENTS = multiple, keep
    step_graph.ENABLED, gpt2.DECODE_ATTENTION = graph, attention
    try:
        yield
    finally:
        (lm_head.GPU_VOCAB_MULTIPLE, lm_head.GPU_KEEP_PROBS_ELEMENTS, step_graph.ENABLED,
         gpt2.DECODE_ATTENTION) = saved


def _update(models, queries, args, initial, device, seed, variant: dict) -> tuple[dict, list, speed.PhaseTimer]:
    with switches(**variant):
        data, _, stats, timer = speed.one_update("ours", models, queries, args, initial, device, seed)
    return data, stats, timer


def compare_variants(size: str, batch_size: int, repeats: int, device: torch.device, seed: int,
                     micro_batch_sequences: int = 0, variants=VARIANTS) -> dict:
    """Every variant's phases (mean over ``repeats``), its peak memory and its differences from the first variant."""
    args = speed.benchmark_args(batch_size, micro_batch_sequences)
    models = speed.build_models(size, args.task.temperature, device, seed)
    initial = {k: v.detach().clone() for k, v in models[0].state_dict().items()}
    queries = speed.make_queries(batch_size, args.task.query_length).to(device)
    rows, first = {}, None
    for name, variant, predicted in variants:  # warm-up: captures, cuBLAS's first calls; the maths against the first
        print(f"[{size}] warm-up: {name} ...", file=sys.stderr, flush=True)
        speed.reset_peak_memory(device)
        data, stats, _ = _update(models, queries, args, initial, device, seed, variant)
        first = first or (data, stats)
        diff = {"log-probs": speed._max_diff(data["logprobs"], first[0]["logprobs"]),
                "PPO loss": max(abs(a["loss/total"] - b["loss/total"]) for a, b in zip(stats, first[1])),
                "responses differ": int((data["responses"] != first[0]["responses"]).any(1).sum())}
        rows[name] = {"runs": [], "peak": speed.peak_memory(device), "diff": diff, "predicted": predicted}
    for r in range(repeats):
        order = variants if r % 2 == 0 else variants[::-1]
        for name, variant, _ in order:
            _, _, timer = _update(models, queries, args, initial, device, seed, variant)
            rows[name]["runs"].append(timer.seconds)
            print(f"[{size}] repeat {r + 1}/{repeats} {name}: " +
                  ", ".join(f"{k} {v:.3f}" for k, v in timer.seconds.items()), file=sys.stderr, flush=True)
    for row in rows.values():
        runs = row.pop("runs")
        row["phases"] = {k: statistics.mean(s.get(k, 0.0) for s in runs) for k in ("sample", "reference", "score", "ppo",
                                                                                  "total")}
        row["min_total"] = min(s["total"] for s in runs)
    flops = speed.matmul_flops(models[0].lm.config, queries, args.task.response_length, args.ppo.noptepochs)["ours"]
    return {"size": size, "batch": batch_size, "micro": micro_batch_sequences, "rows": rows, "flops": flops,
            "models": models, "queries": queries, "args": args, "initial": initial}


def variants_table(result: dict) -> list[str]:
    lines = [f"### {result['size']}, batch {result['batch']}" + (f", --micro-batch-sequences {result['micro']}"
                                                               if result["micro"] else ""), "",
             "| variant | sample | reference fwd | reward fwd | PPO ×4 | total s/update (min) | saved against before "
             "(predicted) | peak memory | max Δ log-prob, Δ PPO loss, responses that differ, against before |",
             "|---|---|---|---|---|---|---|---|---|"]
    base = next(iter(result["rows"].values()))["phases"]["total"]
    for name, row in result["rows"].items():
        ph, d = row["phases"], row["diff"]
        lines.append(f"| {name} | {ph['sample']:.3f} | {ph['reference']:.3f} | {ph['score']:.3f} | {ph['ppo']:.3f} | "
                     f"**{ph['total']:.3f}** ({row['min_total']:.3f}) | {base - ph['total']:+.3f} ({row['predicted']:+.2f}) "
                     f"| {speed._fmt_bytes(row['peak'])} | {d['log-probs']:.1e}, {d['PPO loss']:.1e}, "
                     f"{d['responses differ']} |")
    return lines


def _seconds(fn, device: torch.device, n: int = 10) -> float:
    fn()
    speed._sync(device)
    start = time.perf_counter()
    for _ in range(n):
        fn()
    speed._sync(device)
    return (time.perf_counter() - start) / n


def floors(device: torch.device, d: int = 768, rows: int = 2624) -> dict[str, float]:
    """Measured here: the head's [rows, d] x [d, vocab] product's TF32 rate at 50304 (aligned) and 50257 rows, a
    [45056, 768] x [768, 3072] product's, and the copy bandwidth (bytes read + written per second)."""
    out, gpu = {}, device.type == "cuda"
    rows, n = (rows, 10) if gpu else (64, 2)  # a CPU: the steps, small
    h = torch.randn(rows, d, device=device)
    for vocab in (50304, 50257):
        w = torch.randn(vocab, d, device=device)
        out[f"head product, {vocab} rows, TFLOP/s"] = 2 * rows * d * vocab / _seconds(lambda: h @ w.t(), device, n) / 1e12
    x, w = torch.randn(45056 if gpu else 256, d, device=device), torch.randn(d, 4 * d, device=device)
    out["MLP product, TFLOP/s"] = 2 * x.shape[0] * d * 4 * d / _seconds(lambda: x @ w, device, n) / 1e12
    size = 2**28 if gpu else 2**22
    a, b = torch.empty(size, device=device), torch.empty(size, device=device)
    out["copy, TB/s"] = 2 * 4 * size / _seconds(lambda: b.copy_(a), device, n) / 1e12
    return out


def roofline(result: dict, measured: dict[str, float]) -> list[str]:
    """The rollout's tokens per second against KV-cache and weight reads; the update against its matrix FLOPs."""
    config, queries = result["models"][0].lm.config, result["queries"]
    b, r = result["batch"], result["args"].task.response_length
    default = result["rows"]["after (the defaults)"]["phases"]
    params = sum(p.numel() for p in result["models"][0].parameters())
    real = int((queries != speed.PAD).sum()) / b  # mean real query tokens
    # bytes of keys and values each step reads (float32), and of the weights
    kv = sum(2 * config.n_layer * b * (real + t + 1) * config.n_embd * 4 for t in range(r - 1))
    weights = (r - 1) * params * 4  # every decode step reads every weight once
    bw = measured["copy, TB/s"] * 1e12
    floor = (kv + weights) / bw
    tflop = result["flops"] / 1e12
    return [
        f"- The rollout: {b * r / default['sample']:,.0f} sampled tokens per second ({b} x {r} in "
        f"{default['sample']:.3f} s, prompt pass included). Its {r - 1} token steps read {kv / 1e9:.2f} GB of keys and "
        f"values and {weights / 1e9:.2f} GB of weights: {floor * 1e3:.1f} ms at the measured copy rate "
        f"({measured['copy, TB/s']:.2f} TB/s), a floor of {b * r / floor:,.0f} tokens per second for the steps alone.",
        f"- The update: {tflop:.1f} TFLOP of matrix products (speed.matmul_flops) in {default['total']:.3f} s = "
        f"{tflop / default['total']:.0f} TFLOP/s, {100 * tflop / default['total'] / TF32_DENSE_TFLOPS:.0f}% of the "
        f"datasheet's dense TF32 rate ({TF32_DENSE_TFLOPS} TFLOP/s: {tflop / TF32_DENSE_TFLOPS:.3f} s) and "
        f"{100 * tflop / default['total'] / measured['MLP product, TFLOP/s']:.0f}% of the MLP product's measured rate "
        f"({measured['MLP product, TFLOP/s']:.0f} TFLOP/s: {tflop / measured['MLP product, TFLOP/s']:.3f} s).",
    ]


KERNEL_CLASSES = [  # (class, substrings of a kernel's name), the first that matches
    ("attention", ("fmha", "attention", "flash", "efficient")),
    ("matrix products", ("gemm", "sm90", "sm80", "cutlass", "cublas", "addmm", "aten::mm", "bmm", "matmul", "xmma")),
    ("softmax, reductions", ("reduce", "softmax", "sum", "amax", "max", "cumsum", "scan", "sort")),
    ("copies, indexing", ("copy", "cat", "index", "gather", "scatter", "fill", "pad")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "exp", "mul", "add", "gelu", "layer_norm", "where")),
]


def profile_by_class(result: dict, device: torch.device, variant: tuple = VARIANTS[-1], top: int = 12,
                     sample_only: bool = False) -> list[str]:
    """torch.profiler over one update of ``variant`` (or its sampling pass alone): device time by kernel class and
    the top kernels."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    models, queries, args, initial = result["models"], result["queries"], result["args"], result["initial"]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    if sample_only:  # the sampling pass alone, after one unprofiled call (a graph's capture)
        uniforms = torch.rand(len(queries), args.task.response_length, dtype=torch.float64, device=device)
        with switches(**variant[1]):
            models[0].sample(queries, args.task.response_length, uniforms=uniforms)
            with profile(activities=activities) as prof:
                models[0].sample(queries, args.task.response_length, uniforms=uniforms)
                speed._sync(device)
    else:
        with profile(activities=activities) as prof:
            _update(models, queries, args, initial, device, 1, variant[1])
    events = prof.key_averages()

    def device_us(e) -> float:
        return getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0

    kernels = [e for e in events if e.device_type == DeviceType.CUDA and device_us(e) > 0] if device.type == "cuda" \
        else [e for e in events if e.key.startswith("aten::")]
    time_of = device_us if device.type == "cuda" else (lambda e: e.self_cpu_time_total)
    total = sum(time_of(e) for e in kernels) or 1
    by_class: dict[str, float] = {}
    for e in kernels:
        name = e.key.lower()
        cls = next((c for c, keys in KERNEL_CLASSES if any(k in name for k in keys)), "other")
        by_class[cls] = by_class.get(cls, 0.0) + time_of(e)
    where = "GPU kernel" if device.type == "cuda" else "CPU operator (self)"
    what = "one sampling pass" if sample_only else "one update"
    lines = [f"{where} time of {what} of '{variant[0]}': {total / 1e3:.1f} ms, "
             + ", ".join(f"{c} {100 * t / total:.0f}%" for c, t in sorted(by_class.items(), key=lambda x: -x[1])), "",
             "| kernel | calls | ms | share |", "|---|---|---|---|"]
    for e in sorted(kernels, key=time_of, reverse=True)[:top]:
        lines.append(f"| `{e.key[:90]}` | {e.count} | {time_of(e) / 1e3:.1f} | {100 * time_of(e) / total:.1f}% |")
    return lines


def large_row(batch_size: int, repeats: int, device: torch.device, seed: int, micros: list[int]) -> list[str]:
    """GPT-2 774M's shapes at ``batch_size``, the defaults, with the first of ``micros`` that fits in memory."""
    for micro in micros:
        try:
            result = compare_variants("774m", batch_size, repeats, device, seed, micro, variants=[VARIANTS[-1]])
        except torch.OutOfMemoryError:
            print(f"[774m] --micro-batch-sequences {micro}: out of memory", file=sys.stderr, flush=True)
            torch.cuda.empty_cache()
            continue
        row = result["rows"][VARIANTS[-1][0]]
        ph = row["phases"]
        return [f"- GPT-2 774M's shapes (36 layers, 1280 wide, 20 heads, random weights), batch {batch_size}, "
                f"--micro-batch-sequences {micro}, the defaults: **{ph['total']:.2f} s per update** (min "
                f"{row['min_total']:.2f}; sample {ph['sample']:.2f}, reference {ph['reference']:.2f}, reward "
                f"{ph['score']:.2f}, PPO ×4 {ph['ppo']:.2f}), peak {speed._fmt_bytes(row['peak'])} allocated, "
                f"{result['flops'] / 1e12:.0f} TFLOP of matrix products = {result['flops'] / ph['total'] / 1e12:.0f} "
                f"TFLOP/s; a 1M-episode run {-(-1_000_000 // batch_size) * ph['total'] / 3600:.1f} h."]
    return [f"- GPT-2 774M's shapes: out of memory at every --micro-batch-sequences in {micros}"]


is_our_report = first_line_starts(b"# speed_variants.py on ")  # a report this script wrote: a new run replaces it


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="speed_variants.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", nargs="*", choices=["tiny", "124m"], default=["124m"],
                   help="model sizes (default 124m; none: only --large)")
    p.add_argument("--batch-size", type=int, default=512, help="episodes per update (default 512)")
    p.add_argument("--repeats", type=int, default=3, help="timed updates per variant after its warm-up (default 3)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1 ... (default auto: cuda if available)")
    p.add_argument("--large", nargs="+", default=["256", "128", "64"],
                   help="774M's --micro-batch-sequences to try in turn (default 256 128 64), or 'none'")
    p.add_argument("--variants", nargs="+", choices=[name for name, _, _ in VARIANTS], default=None,
                   help="the variants to time (default all; 'before' and 'after (the defaults)' are always in)")
    p.add_argument("--profile", choices=[name for name, _, _ in VARIANTS], default=VARIANTS[-1][0],
                   help="the variant profiled (default 'after (the defaults)')")
    p.add_argument("--seed", type=int, default=1, help="seed of the weights, queries and sampling (default 1)")
    p.add_argument("--out", default=None, help="also write the report to this markdown file")
    args = p.parse_args(argv)
    try:  # a new file, or a report this script wrote: checked before anything runs (utils/outputs.py)
        out = args.out and check_output_file(args.out, flag="--out", ours=is_our_report, what="markdown file",
                                             writer="run of speed_variants.py")
    except UserError as e:
        p.exit(2, f"error: {e}\n")
    device = pick_device(args.device, tf32=True)
    written: list[str] = []

    def emit(lines: list[str]) -> None:  # printed and written as each part ends: a step stopped at its limit keeps them
        text = "\n".join(lines) + "\n"
        print(text, flush=True)
        written.append(text)
        if out:
            out.parent.mkdir(parents=True, exist_ok=True)
            with new_or_ours(out, is_our_report) as tmp:
                tmp.write_text("".join(written))

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    measured = floors(device)
    emit([f"# speed_variants.py on {name}, torch {torch.__version__}"
          + (f", CUDA {torch.version.cuda}" if device.type == "cuda" else ""), "",
          "Measured here: " + ", ".join(f"{k} {v:.2f}" for k, v in measured.items()) + ".", ""])
    chosen = [v for v in VARIANTS if args.variants is None or v[0] in {*args.variants, VARIANTS[0][0], VARIANTS[-1][0]}]
    for size in args.sizes:
        result = compare_variants(size, args.batch_size, args.repeats, device, args.seed, variants=chosen)
        emit(variants_table(result) + [""] + roofline(result, measured) + [""])
        profiled = next(v for v in VARIANTS if v[0] == args.profile)
        emit(profile_by_class(result, device, profiled) + [""])
        emit(profile_by_class(result, device, profiled, top=8, sample_only=True) + [""])
        del result
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if args.large != ["none"] and device.type == "cuda":
        emit(large_row(args.batch_size, max(1, args.repeats - 1), device, args.seed, [int(m) for m in args.large]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
