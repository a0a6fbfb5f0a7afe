"""The CUDA paths: the same numbers as on a CPU, as the plain computation, and under --bf16 and --compile.

Skipped without a GPU (CI has none); run them on a GPU box with `python -m pytest tests/e2e/test_gpu.py`.
"""

import pytest
import torch
import torch.nn.functional as F

from lm_human_preference_details.language.lm_head import logprob_chunk_rows, response_logprobs
from lm_human_preference_details.language.model import Policy, RewardModel, load_lm

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
PAD = 50257
CONTEXTS = [[464, 3290, PAD, PAD, 318, 13], [40, 588, 13, PAD, PAD, PAD], [383, 3290, 318, 257, 1049, 13]]


@pytest.fixture()
def full_fp32():
    """Full float32 matrix products (no TF32) for the duration of a test: comparisons at 1e-5."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before


@pytest.fixture(scope="module")
def policies(tiny_model_dir):
    """The same policy on the CPU and on the GPU, with a non-zero value head."""
    torch.manual_seed(0)
    cpu = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    torch.nn.init.normal_(cpu.head.weight, std=0.1)
    gpu = Policy(load_lm(str(tiny_model_dir)), PAD, temperature=0.7)
    gpu.load_state_dict(cpu.state_dict())
    return cpu, gpu.cuda()


def test_cuda_sampler_logprobs_and_values_equal_a_full_forward_and_the_cpu(policies, full_fp32):
    # C1-C3 on the GPU: the KV-cached sampler's log-probs and values equal a full forward over the same tokens
    # (pads mid-sequence), and both equal the CPU's numbers for those tokens
    cpu, gpu = policies
    contexts = torch.tensor(CONTEXTS)
    out = gpu.sample(contexts.cuda(), length=8, generator=torch.Generator("cuda").manual_seed(1))
    assert out["responses"].shape == (3, 8) and int(out["responses"].max()) < PAD
    with torch.no_grad():
        analysed = gpu.analyze_responses(contexts.cuda(), out["responses"])
        on_cpu = cpu.analyze_responses(contexts, out["responses"].cpu())
    for k in ("logprobs", "values"):
        torch.testing.assert_close(out[k], analysed[k], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[k].cpu(), on_cpu[k], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(analysed["entropies"].cpu(), on_cpu["entropies"], atol=1e-4, rtol=1e-5)


def test_cuda_reward_equals_the_cpu(tiny_model_dir, full_fp32):
    torch.manual_seed(0)
    cpu = RewardModel(load_lm(str(tiny_model_dir)), PAD)
    gpu = RewardModel(load_lm(str(tiny_model_dir)), PAD)
    gpu.load_state_dict(cpu.state_dict())
    tokens = torch.tensor([[464, 3290, PAD, 318, 13, PAD, PAD], [40, 588, 13, 257, 11, 12, 13]])
    with torch.no_grad():
        torch.testing.assert_close(gpu.cuda()(tokens.cuda()).cpu(), cpu(tokens), atol=1e-5, rtol=1e-5)


def test_cuda_chunked_logprobs_over_several_gpu_chunks_match_the_plain_computation(full_fp32):
    # the GPU's chunk size (logprob_chunk_rows) with more rows than one chunk holds, the softmax recomputed in backward
    torch.manual_seed(0)
    v, d = 50257, 64
    rows = logprob_chunk_rows(v, torch.device("cuda")) + 100
    h = torch.randn(1, rows, d, device="cuda", requires_grad=True)
    w = (torch.randn(v, d, device="cuda") * 0.1).requires_grad_()
    labels = torch.randint(0, v, (1, rows), device="cuda")
    logprobs, entropies = response_logprobs(h, w, labels, temperature=0.7, keep_probs_elements=0)
    logp = F.log_softmax(h @ w.t() / 0.7, -1)
    expected = logp.gather(-1, labels[..., None]).squeeze(-1)
    torch.testing.assert_close(logprobs, expected, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(entropies, -(logp.exp() * logp).sum(-1).detach(), atol=1e-3, rtol=1e-5)
    g = torch.randn(1, rows, device="cuda")
    grads = torch.autograd.grad((logprobs * g).sum(), (h, w))
    expected_grads = torch.autograd.grad((expected * g).sum(), (h, w))
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_cuda_aligned_head_keeps_batch_512s_softmax_and_matches_the_plain_computation():
    # the default on a GPU: the head padded to 50304 rows, the softmax of all rows kept for the backward pass
    torch.manual_seed(0)
    v, d, rows = 50257, 64, 3000
    h = torch.randn(1, rows, d, device="cuda", requires_grad=True)
    w = (torch.randn(v, d, device="cuda") * 0.1).requires_grad_()
    labels = torch.randint(0, v, (1, rows), device="cuda")
    logprobs, entropies = response_logprobs(h, w, labels, temperature=0.7)
    assert logprobs.grad_fn.next_functions[0][0].saved_tensors[-1].shape == (rows, 50304)  # kept, padded
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False  # the plain computation in full float32
    logp = F.log_softmax(h @ w.t() / 0.7, -1)
    torch.backends.cuda.matmul.allow_tf32 = before
    expected = logp.gather(-1, labels[..., None]).squeeze(-1)
    tol = dict(atol=2e-2, rtol=1e-3) if before else dict(atol=1e-4, rtol=1e-5)  # TF32: 10-bit products
    torch.testing.assert_close(logprobs, expected, **tol)
    torch.testing.assert_close(entropies, -(logp.exp() * logp).sum(-1).detach(), **tol)
    g = torch.randn(1, rows, device="cuda")
    grads = torch.autograd.grad((logprobs * g).sum(), (h, w))
    expected_grads = torch.autograd.grad((expected * g).sum(), (h, w))
    for a, b in zip(grads, expected_grads):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("attention", ["sdpa", "auto"])
def test_cuda_graph_of_the_sampling_steps_gives_the_eager_loops_numbers_bit_for_bit(policies, attention):
    # every sampling pass with given uniforms (training's) replays one CUDA graph per shape: the eager loop's numbers
    # exactly, with other inputs, and after the weights change in place (an optimizer step)
    from lm_human_preference_details.language import gpt2, step_graph

    _, gpu = policies
    saved = {k: v.clone() for k, v in gpu.state_dict().items()}
    contexts = torch.tensor(CONTEXTS).cuda()
    draws = torch.Generator().manual_seed(2)

    def eager_and_graphed():
        u = torch.rand(3, 8, dtype=torch.float64, generator=draws).cuda()
        step_graph.ENABLED = False
        try:
            eager = gpu.sample(contexts, length=8, uniforms=u)
        finally:
            step_graph.ENABLED = True
        return eager, gpu.sample(contexts, length=8, uniforms=u)

    gpt2.DECODE_ATTENTION = attention
    try:
        for change in (None, "other uniforms", "weights"):
            if change == "weights":
                with torch.no_grad():
                    for p in gpu.parameters():
                        p.mul_(1.01)
            eager, graphed = eager_and_graphed()
            for k in ("responses", "logprobs", "values"):
                assert torch.equal(eager[k], graphed[k]), (change, k)
        assert list(step_graph.graphs_of(gpu)._graphs) == [(next(iter(step_graph.graphs_of(gpu)._caches)), attention)]
    finally:
        gpt2.DECODE_ATTENTION = "auto"
        gpu.load_state_dict(saved)
        step_graph.graphs_of(gpu).clear()


def test_cuda_decode_attention_products_equal_sdpa_and_a_graph_follows_the_switch(policies, full_fp32):
    # the GPU's default decode attention (two float32 products) gives SDPA's numbers to float rounding, and each
    # switch has its own graph
    from lm_human_preference_details.language import gpt2, step_graph

    _, gpu = policies
    contexts = torch.tensor(CONTEXTS).cuda()
    u = torch.rand(3, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).cuda()
    outs = {}
    try:
        for attention in ("sdpa", "auto"):
            gpt2.DECODE_ATTENTION = attention
            outs[attention] = gpu.sample(contexts, length=8, uniforms=u)
        # one cache for the shape, a graph for each switch
        assert len(step_graph.graphs_of(gpu)._caches) == 1
        assert sorted(a for _, a in step_graph.graphs_of(gpu)._graphs) == ["auto", "sdpa"]
    finally:
        gpt2.DECODE_ATTENTION = "auto"
        step_graph.graphs_of(gpu).clear()
    assert torch.equal(outs["sdpa"]["responses"], outs["auto"]["responses"])
    for k in ("logprobs", "values"):
        torch.testing.assert_close(outs["auto"][k], outs["sdpa"][k], atol=1e-5, rtol=1e-5)


def test_cuda_bf16_autocast_stays_close_to_fp32(policies):
    # --bf16 (a numerics deviation): sampling and scoring run in bfloat16 and stay near the float32 numbers
    _, gpu = policies
    contexts = torch.tensor(CONTEXTS).cuda()
    out = gpu.sample(contexts, length=8, generator=torch.Generator("cuda").manual_seed(1))
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        half = gpu.analyze_responses(contexts, out["responses"])
        sampled = gpu.sample(contexts, length=8, generator=torch.Generator("cuda").manual_seed(1))
    assert half["logprobs"].dtype == torch.float32 and sampled["responses"].shape == (3, 8)
    torch.testing.assert_close(half["logprobs"], out["logprobs"], atol=0.1, rtol=0.05)
    torch.testing.assert_close(half["values"], out["values"], atol=0.05, rtol=0.05)


def test_cuda_compiled_blocks_give_the_same_numbers_and_gradients(policies, full_fp32, eager_and_compiled):
    # --compile on the GPU: Triton kernels for block_tail, the same numbers and gradients as eager
    _, gpu = policies
    contexts = torch.tensor(CONTEXTS).cuda()
    responses = torch.randint(0, PAD, (3, 6), generator=torch.Generator().manual_seed(0)).cuda()
    params = list(gpu.lm.parameters())

    def run():
        out = gpu.analyze_responses(contexts, responses)
        return out, torch.autograd.grad(out["logprobs"].sum() + out["values"].sum(), params)

    (eager, eager_grads), (compiled, compiled_grads) = eager_and_compiled(run)
    for k in ("logprobs", "values"):
        torch.testing.assert_close(compiled[k], eager[k], atol=1e-5, rtol=1e-5)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


def test_cuda_background_save_copies_on_its_own_stream_before_the_weights_change(tmp_path):
    """The saver's thread copies GPU tensors on a stream of its own, after the work queued before `save`."""
    from lm_human_preference_details.run import checkpoint as ckpt
    from lm_human_preference_details.run import saver as background

    layer = torch.nn.Linear(512, 512).cuda()
    with torch.no_grad():
        for _ in range(20):  # work still queued on the default stream when save() is called
            layer.weight.mul_(1.001)
    expected = layer.weight.detach().cpu()  # (synchronises: what the queued work gives)
    with torch.no_grad():
        layer.weight.mul_(1.001)
    expected = expected * 1.001
    saver = background.BackgroundSaver(tmp_path, keep=1)
    path = saver.save(1, ckpt.training_state(1, {"layer": layer}))
    saver.wait_copied()
    with torch.no_grad():
        layer.weight.add_(1.0)  # the optimizer's step, after wait_copied
    saver.wait()
    saved = ckpt.load_checkpoint(path)["objects"]["layer"]["weight"]
    assert saved.device.type == "cpu"
    torch.testing.assert_close(saved, expected, atol=1e-5, rtol=1e-5)
