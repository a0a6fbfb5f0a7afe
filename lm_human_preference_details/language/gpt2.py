"""GPT-2's forward pass over the real tokens only: the original's masked semantics without computing pads.

Under OAI `language/model.py` (FIDELITY B1 pad mask and positions, B2 last real token) a pad is never attended to, does not
advance positions,
and its own output is a copy of the last real token's. So a pad changes nothing, and computing it is
waste: queries are right-padded to 64 tokens (docs/speed.md counts the pads). Here the linear layers,
layer norms and MLPs (nearly all the work) run on the real tokens of the batch packed into one
[n_real, d] matrix. Attention puts them back into a [batch, longest, d] layout with each sequence's
real tokens left-aligned: a real token's column there is its position id (B1 pad mask and positions: the exclusive cumsum), so
plain causal attention over that layout is exactly the original's masked attention. The last block
computes its attention output and MLP only at the rows whose outputs are read (its keys and values
still come from every real token). Same numbers as the padded Hugging Face forward within float
rounding (tests/language/test_gpt2.py), with the same modules and weights; other architectures use that forward.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn.functional as F
from torch import nn


def supports_packing(lm: nn.Module) -> bool:
    """True for a Hugging Face GPT-2 whose blocks compute what `packed_hidden` computes."""
    from transformers import GPT2Model  # transformers takes seconds to import: a flag's error line never waits for it

    config = lm.config
    return (isinstance(lm.base_model, GPT2Model) and not config.add_cross_attention
            and not getattr(config, "reorder_and_upcast_attn", False))  # HF's upcast path is eager-only numerics


TANH_GELUS = ("gelu_new", "gelu_pytorch_tanh")  # GPT-2's activation: 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))


def mlp(base: nn.Module, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The block's MLP on [..., d]; GPT-2's tanh GELU as PyTorch's one fused kernel (the same formula)."""
    h = block.mlp.c_fc(x)
    h = F.gelu(h, approximate="tanh") if base.config.activation_function in TANH_GELUS else block.mlp.act(h)
    return block.mlp.c_proj(h)


def block_tail(base: nn.Module, block: nn.Module, x: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
    """A block after its attention: [m, d] residual stream and [m, d] attention heads -> [m, d] block output."""
    x = x + block.attn.c_proj(o)
    return x + mlp(base, block, block.ln_2(x))


_block_tail = block_tail  # what the forward passes call: block_tail itself, or its compiled form (compile_blocks)


def compile_blocks(enabled: bool) -> None:
    """Run `block_tail` through torch.compile (its layer norm, GELU and residual adds fused) or not; same maths."""
    global _block_tail
    # dynamic: the number of rows changes with every batch's real tokens; one graph serves all blocks and sizes
    _block_tail = torch.compile(block_tail, dynamic=True) if enabled else block_tail


class KVCache:
    """Preallocated keys and values of every block, [layers, b, heads, width, head_dim] each, left-aligned layout."""

    def __init__(self, base: nn.Module, batch: int, width: int, like: torch.Tensor):
        attn = base.h[0].attn
        shape = (len(base.h), batch, attn.num_heads, width, attn.head_dim)
        device = like.device.type
        # the dtype the blocks' linear layers produce: autocast's (--bf16) when it is on, else the weights'
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else like.dtype
        self.keys = like.new_zeros(shape, dtype=dtype)
        self.values = like.new_zeros(shape, dtype=dtype)


def packed_hidden(base: nn.Module, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                  read: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
    """Final hidden states [b, s, d] at the real positions ``read`` [b, s] of [b, t] tokens (pads anywhere).

    ``input_ids``, ``mask``, ``positions`` come from `model.prepare_inputs`; every ``read`` position must be real.
    With a ``cache``, every block's keys and values are also written to its first columns.
    """
    b, t = mask.shape
    s = read.shape[1]
    longest = int(mask.sum(1).max())
    real = mask.reshape(-1).nonzero().squeeze(1)  # [n] flat indices of the real tokens, in order
    seq = real // t  # [n] the sequence of each real token
    # [n] its column in the left-aligned layout = its position id (B1 pad mask and positions)
    columns = positions.reshape(-1)[real]
    slots = seq * longest + columns  # [n] its row in the [b * longest] left-aligned layout
    x = F.embedding(input_ids.reshape(-1)[real], base.wte.weight) + F.embedding(columns, base.wpe.weight)  # [n, d]
    packed_row = torch.cumsum(mask.reshape(-1).long(), 0) - 1  # [b * t] packed row of each real position
    read_rows = packed_row[(torch.arange(b, device=mask.device)[:, None] * t + read).reshape(-1)]  # [b * s]
    read_columns = positions.gather(1, read)  # [b, s] their columns in the left-aligned layout
    blocks = list(base.h)
    for i, block in enumerate(blocks):
        attn = block.attn
        qkv = attn.c_attn(block.ln_1(x))  # [n, 3d]
        # the left-aligned layout: zeros after each sequence's last real token, never attended to (causal)
        grid = qkv.new_zeros(b * longest, qkv.shape[1]).index_copy(0, slots, qkv)  # [b * longest, 3d]
        q, k, v = grid.view(b, longest, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)  # [b, h, longest, hd] each
        if cache is not None:
            cache.keys[i, :, :, :longest], cache.values[i, :, :, :longest] = k, v
        if i < len(blocks) - 1:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=attn.scaling)  # [b, h, longest, hd]
            o = o.transpose(1, 2).reshape(b * longest, -1).index_select(0, slots)  # [n, d]
        else:  # last block: only the rows that are read
            q = q.gather(2, read_columns[:, None, :, None].expand(b, attn.num_heads, s, attn.head_dim))  # [b, h, s, hd]
            visible = torch.arange(longest, device=mask.device) <= read_columns[:, None, :, None]  # [b, 1, s, longest]
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=attn.scaling)  # [b, h, s, hd]
            o = o.transpose(1, 2).reshape(b * s, -1)  # [b * s, d]
            x = x.index_select(0, read_rows)  # [b * s, d]
        x = _block_tail(base, block, x, o)
    return base.ln_f(x).view(b, s, -1)  # [b, s, d]


def decode_step(base: nn.Module, tokens: torch.Tensor, columns: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """One new real token per sequence, [b] ids at [b] columns (= position ids) -> [b, d] final hidden states.

    Its keys and values go into the cache at its column; it attends to the columns before it and itself.
    """
    b = tokens.shape[0]
    rows = torch.arange(b, device=tokens.device)
    visible = (torch.arange(cache.keys.shape[3], device=tokens.device) <= columns[:, None])[:, None, None]  # [b, 1, 1, width]
    x = F.embedding(tokens, base.wte.weight) + F.embedding(columns, base.wpe.weight)  # [b, d]
    for i, block in enumerate(base.h):
        attn = block.attn
        q, k, v = attn.c_attn(block.ln_1(x)).view(b, 3, attn.num_heads, attn.head_dim).unbind(1)  # [b, h, hd] each
        cache.keys[i, rows, :, columns], cache.values[i, rows, :, columns] = k, v
        o = decode_attention(q, cache.keys[i], cache.values[i], visible, attn.scaling)  # [b, h, 1, hd]
        x = _block_tail(base, block, x, o.reshape(b, -1))
    return base.ln_f(x)  # [b, d]


DECODE_ATTENTION = "auto"  # the switch: "sdpa" (PyTorch's fused kernel), "products", or "auto" (products on a GPU)


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
                     scale: float) -> torch.Tensor:
    """One query per head: [b, h, hd] queries, [b, h, width, hd] keys and values, [b, 1, 1, width] visible columns
    -> [b, h, 1, hd] softmax(q k / sqrt(hd)) v over the visible columns (DECODE_ATTENTION says how).

    "products": two batched products with full float32 accumulation (no TF32), a masked softmax between. On a GPU,
    SDPA's float32 kernel tiles queries by 64 and so did 64 times the work of one query: 0.41 ms a call, 59% of a
    sampling pass (docs/speed.md). A CPU keeps SDPA ("auto"): its numbers stay those of earlier releases.
    """
    products = DECODE_ATTENTION == "products" or (DECODE_ATTENTION == "auto" and q.is_cuda)
    if not products:
        return F.scaled_dot_product_attention(q[:, :, None], keys, values, attn_mask=visible, scale=scale)
    with full_float32_products(q.device):
        scores = (keys @ q[..., None]).squeeze(-1) * scale  # [b, h, width]
        weights = torch.softmax(scores.masked_fill_(~visible[:, :, 0], float("-inf")), dim=-1)
        return weights[:, :, None] @ values  # [b, h, 1, hd]


@contextmanager
def full_float32_products(device: torch.device) -> Iterator[None]:
    """float32 matrix products on a GPU without TF32 inside (the attention's float32 kernel never used TF32)."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
