"""The sampler's token steps on a GPU, captured once as a CUDA graph and replayed for every batch of the same shape.

After the prompt's forward pass, each of the 24 steps runs a few hundred small kernels (12 blocks of one token per
sequence, the LM head's draw, the value head). A CUDA graph launches the whole loop at once. On an H200 that alone
saved little (the steps were bound by SDPA's float32 kernel, not by launches: docs/speed.md); with the decode attention
as two products (gpt2.decode_attention) it took the sampling pass from 0.192 to 0.134 s. A replay runs the very kernels
of the capture on the same addresses, so it gives the numbers of the eager loop it captured (tests/e2e/test_gpu.py
compares them bit for bit), and every sampling pass of a run, the first one too, comes from a replay: a resumed run
samples as the uninterrupted one did.

What a graph needs, and `StepGraphs.apply` checks: every input in a tensor it owns (the first hidden states, the next
columns, the uniforms; the KV cache is its own and the prompt's pass writes into it), no randomness drawn inside
(the uniforms are given), no autocast (its weight copies would be captured too), no torch.compile, and the weights
where they were at the capture (an optimizer step writes them in place; a moved model is captured again).
"""

from __future__ import annotations

import weakref
from typing import Callable

import torch
from torch import nn

from lm_human_preference_details.language import gpt2

ENABLED = True  # the switch: False runs the eager loop (benchmarks/speed_variants.py measures both)

Steps = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]


class StepGraph:
    """One captured loop: static inputs (h [b, d], columns [b], uniforms [b, length]) -> static outputs."""

    def __init__(self, steps: Steps, h: torch.Tensor, columns: torch.Tensor, uniforms: torch.Tensor,
                 weights: list[torch.Tensor]):
        self.h, self.columns, self.uniforms = h.clone(), columns.clone(), uniforms.clone()
        self.pointers = [w.data_ptr() for w in weights]
        side = torch.cuda.Stream(h.device)  # warm up outside the graph (cuBLAS's and the allocator's first calls)
        side.wait_stream(torch.cuda.current_stream(h.device))
        with torch.cuda.stream(side):
            steps(self.h, self.columns, self.uniforms)
        torch.cuda.current_stream(h.device).wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = steps(self.h, self.columns, self.uniforms)

    def replay(self, h: torch.Tensor, columns: torch.Tensor, uniforms: torch.Tensor) -> dict[str, torch.Tensor]:
        """The loop on these inputs -> its outputs, copied out of the graph's memory (the next replay reuses it)."""
        self.h.copy_(h)
        self.columns.copy_(columns)
        self.uniforms.copy_(uniforms)
        self.graph.replay()
        return {k: v.clone() for k, v in self.out.items()}


class StepGraphs:
    """A model's captured loops, one per shape (batch, cache width, length) and decode-attention switch, with the KV
    cache of each shape (the prompt's pass writes it, the loop reads and extends it)."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        """Forget every cache and graph (their memory goes back to PyTorch's allocator)."""
        self._caches: dict[tuple, object] = {}
        self._graphs: dict[tuple, StepGraph] = {}

    @staticmethod
    def apply(like: torch.Tensor, uniforms: torch.Tensor | None) -> bool:
        """Whether the loop may be captured: a CUDA device, given uniforms, no autocast, no torch.compile."""
        return (ENABLED and like.is_cuda and uniforms is not None and not torch.is_autocast_enabled("cuda")
                and gpt2._block_tail is gpt2.block_tail and not torch.cuda.is_current_stream_capturing())

    def cache(self, shape: tuple, make: Callable[[], object]) -> object:
        """The KV cache for ``shape``: made once, written by every prompt pass of that shape."""
        if shape not in self._caches:
            self._caches[shape] = make()
        return self._caches[shape]

    def run(self, shape: tuple, steps: Steps, h: torch.Tensor, columns: torch.Tensor, uniforms: torch.Tensor,
            weights: list[torch.Tensor]) -> dict[str, torch.Tensor]:
        """The loop for ``shape`` replayed on these inputs; captured first when new for this shape and decode
        attention (gpt2.DECODE_ATTENTION names the kernels), or when a weight has moved."""
        key = (shape, gpt2.DECODE_ATTENTION)
        graph = self._graphs.get(key)
        if graph is None or graph.pointers != [w.data_ptr() for w in weights]:
            graph = self._graphs[key] = StepGraph(steps, h, columns, uniforms, weights)
        return graph.replay(h, columns, uniforms)


_BY_MODEL: "weakref.WeakKeyDictionary[nn.Module, StepGraphs]" = weakref.WeakKeyDictionary()


def graphs_of(model: nn.Module) -> StepGraphs:
    """The captured loops of ``model`` (kept beside it, not in it: a deep copy or a state dict never carries them)."""
    if model not in _BY_MODEL:
        _BY_MODEL[model] = StepGraphs()
    return _BY_MODEL[model]
