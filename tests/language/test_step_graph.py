"""step_graph: when the sampler's steps may be captured, and what is kept per model (capture and replay: the CUDA tests)."""

import copy

import torch

from lm_human_preference_details.language import gpt2, step_graph
from lm_human_preference_details.language.step_graph import StepGraphs, graphs_of


def test_a_capture_needs_a_gpu_given_uniforms_no_autocast_and_no_compile(monkeypatch):
    u = torch.zeros(2, 3, dtype=torch.float64)
    cuda_like = type("CudaLike", (), {"is_cuda": True})()  # a tensor's `is_cuda` is all `apply` reads of it
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)  # (a CPU build cannot ask)
    assert StepGraphs.apply(cuda_like, u)
    assert not StepGraphs.apply(torch.zeros(2), u)  # a CPU: the eager loop
    assert not StepGraphs.apply(cuda_like, None)  # no uniforms: draws from a generator inside the loop
    monkeypatch.setattr(step_graph, "ENABLED", False)
    assert not StepGraphs.apply(cuda_like, u)
    monkeypatch.setattr(step_graph, "ENABLED", True)
    monkeypatch.setattr(gpt2, "_block_tail", torch.compile(gpt2.block_tail))  # --compile
    assert not StepGraphs.apply(cuda_like, u)
    monkeypatch.setattr(gpt2, "_block_tail", gpt2.block_tail)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)  # inside another capture
    assert not StepGraphs.apply(cuda_like, u)


def test_graphs_are_kept_beside_a_model_a_cache_per_shape_and_never_copied():
    model = torch.nn.Linear(2, 2)
    graphs = graphs_of(model)
    assert graphs_of(model) is graphs and graphs_of(copy.deepcopy(model)) is not graphs
    made = []
    first = graphs.cache(("shape", 1), lambda: made.append(1) or object())
    assert graphs.cache(("shape", 1), lambda: made.append(2) or object()) is first and made == [1]
    graphs.cache(("shape", 2), lambda: made.append(3) or object())
    assert made == [1, 3] and "graphs" not in str(model.state_dict())
    graphs.clear()
    assert graphs.cache(("shape", 1), lambda: made.append(4) or object()) is not first and made == [1, 3, 4]
