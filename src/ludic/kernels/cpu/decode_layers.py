"""The lean decoder's layers in one native call a decoding step (``decode_layers.cpp``).

With the decoding matmuls (``decode_gemm.py``) and the attention (``decode_attention.py``) on Ludic's kernels,
a 32-row step of SmolLM2-135M still spent about 12 ms of its ~56 outside them (2 threads, the AMD EPYC
measured): the step's ~20 small PyTorch ops a layer (two RMSNorms of several ops each, RoPE's roll and
products, the SiLU and its gate, the residual adds, views) at 3-20 us each, and the Python around each
kernel call, 30 layers over. That cost is per step, not per row, so it weighs most as rows finish. This
kernel runs every layer in one call: the same matmul and attention functions, with the RMSNorm (the residual
add in the same pass), RoPE and the gated SiLU written beside them in C++. A step 1.13x / 1.29x faster at 32 /
4 rows, the engine's 32 x 64 generation 1.165x (``bench/bench_decode_layers.py``, docs/benchmarks.md).

Values equal the Python loop's to fp32 rounding (other sum orders, ``simd_exp.h``'s exponential), not bit
for bit (tests). Built with Ludic's other C++ kernels (``native.py``); ``available()`` is False, logged once,
where they cannot be built or this kernel gives other values than PyTorch on a probe; the decoder then keeps
its Python loop (``ludic.kernels.select``'s ``decode_layers``). ``layer_table`` says which layers and caches
it takes (plain Llama-style layers on ``decode_gemm``'s packed weights, the shared-prefix cache on its
native attention); for any other the Python loop runs.
"""

from __future__ import annotations

import ctypes
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F

from ludic.kernels.cpu import decode_attention, native
from ludic.kernels.cpu.lean_weights import LayerWeights
from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache

logger = logging.getLogger(__name__)

TABLE = (
    "input_norm", "post_norm", "qkv", "qkv_bias", "o_proj", "o_bias", "gate_up", "gate_up_bias", "down",
    "down_bias", "k_pre", "v_pre", "k_suf", "v_suf",
)  # fmt: skip
"""Each layer's pointers, in ``decode_layers.cpp``'s order (its ``Slot``)."""
DIMS = ("rows", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "width", "max_new", "column", "layers")
"""A call's sizes, in ``decode_layers.cpp``'s order (its ``Dim``)."""

_KERNEL = native.ProbedKernel(
    lambda lib: _probe(lib), kernel="decoding layers", compared_with="PyTorch's layer",
    fallback="the lean decoder's Python loop runs instead", log=logger,
)  # fmt: skip
"""Loaded and probed against PyTorch once per process (``native.ProbedKernel``); a failure logged once."""
available = _KERNEL.available
unavailable_reason = _KERNEL.unavailable_reason
_lib = _KERNEL.lib


@dataclass(frozen=True)
class LayerTable:
    """The pointers of one batch's layers and cache, built once (``layer_table``) and read every step."""

    pointers: ctypes.Array  # layers x len(TABLE) void pointers
    tensors: tuple[torch.Tensor, ...]  # what the pointers point into, kept alive with them
    sizes: dict[str, int]  # DIMS but rows and column
    eps: float
    scale: float


def _plain(w: LayerWeights) -> bool:
    """A layer the kernel runs: q/k/v and gate/up each one fused, packed matmul, no adapter or per-head norm."""
    projs = [*w.qkv, w.o_proj, *w.gate_up, w.down]
    return (
        w.lora is None and w.qk_norm is None and len(w.qkv) == 1 and len(w.gate_up) == 1
        and all(p.dim() == 3 and p.dtype == torch.float32 for p, _ in projs)
        and all(b is None or (b.dtype == torch.float32 and b.is_contiguous()) for _, b in projs)
    )  # fmt: skip


def layer_table(
    layers: Sequence[LayerWeights], cache: object, *, heads: int, kv_heads: int, head_dim: int, scale: float
) -> LayerTable | None:
    """The table for these bound layers and this batch's cache, or None where the kernel does not take them
    (the Python loop runs): another cache, a layer ``_plain`` does not accept, norms of differing eps."""
    if not isinstance(cache, SharedPrefixKVCache) or not cache.native or not layers or not available():
        return None
    norms = [n for w in layers for n in (w.input_norm, w.post_norm)]
    if not all(map(_plain, layers)) or len({eps for _, eps in norms}) != 1:
        return None
    if any(n.dtype != torch.float32 or not n.is_contiguous() for n, _ in norms):
        return None
    if not decode_attention.supports(head_dim, heads // kv_heads):
        return None
    return _table(layers, cache, heads=heads, kv_heads=kv_heads, head_dim=head_dim, scale=scale)


def _table(
    layers: Sequence[LayerWeights], cache: SharedPrefixKVCache, *, heads: int, kv_heads: int, head_dim: int, scale: float
) -> LayerTable:
    rows = []
    for i, w in enumerate(layers):
        k_pre, v_pre = cache.prefix[i]
        entries = (w.input_norm[0], w.post_norm[0], *w.qkv[0], *w.o_proj, *w.gate_up[0], *w.down,
                   k_pre, v_pre, cache.suffix[i, 0], cache.suffix[i, 1])  # fmt: skip
        rows.append([None if t is None else t.data_ptr() for t in entries])
    pointers = (ctypes.c_void_p * (len(layers) * len(TABLE)))(*(p for row in rows for p in row))
    sizes = {
        "hidden": layers[0].input_norm[0].shape[0], "intermediate": layers[0].down[0].shape[1], "heads": heads,
        "kv_heads": kv_heads, "head_dim": head_dim, "width": cache.width, "max_new": cache.suffix.shape[4],
        "layers": len(layers),
    }  # fmt: skip
    kept = (*(t for w in layers for t in _tensors(w)), cache.suffix, *(t for kv in cache.prefix for t in kv))
    return LayerTable(pointers, kept, sizes, float(layers[0].input_norm[1]), float(scale))


def _tensors(w: LayerWeights) -> list[torch.Tensor]:
    projs = [*w.qkv, w.o_proj, *w.gate_up, w.down]
    return [w.input_norm[0], w.post_norm[0], *(t for p in projs for t in p if t is not None)]


def run(table: LayerTable, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: SharedPrefixKVCache, column: int) -> torch.Tensor:
    """``x [rows, hidden]`` (the step's embedded tokens, updated in place) through every layer, this step's
    K/V written at ``column`` (counted from the prompts' first column) of the cache; ``cos``/``sin [rows,
    head_dim]`` each row's RoPE tables at its position (``LeanDecoder.rope_tables``)."""
    return _run(_lib(), table, x, cos, sin, cache, column)


def _run(lib: ctypes.CDLL, table: LayerTable, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
         cache: SharedPrefixKVCache, column: int) -> torch.Tensor:  # fmt: skip
    rows, s = x.shape[0], table.sizes
    if x.dtype != torch.float32 or x.shape != (rows, s["hidden"]) or not x.is_contiguous() or rows != cache.rows:
        raise ValueError(f"x must be a contiguous float32 [{cache.rows}, {s['hidden']}] (the cache's live rows), got {tuple(x.shape)} {x.dtype}")
    cos, sin = cos.contiguous(), sin.contiguous()
    if cos.shape != (rows, s["head_dim"]) or sin.shape != cos.shape:
        raise ValueError(f"cos and sin must be [{rows}, {s['head_dim']}], got {tuple(cos.shape)}, {tuple(sin.shape)}")
    if not 0 <= column - cache.width < s["max_new"]:
        raise ValueError(f"column {column} is outside the cache's decoded columns [{cache.width}, {cache.width + s['max_new']})")
    cache.begin(column)
    qkv = (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]
    scratch = torch.empty(rows * (2 * s["hidden"] + qkv + s["heads"] * s["head_dim"] + 3 * s["intermediate"]))
    dims = (ctypes.c_int64 * len(DIMS))(*({**s, "rows": rows, "column": column - cache.width}[d] for d in DIMS))
    lib.ludic_decode_layers(
        x.data_ptr(), cos.data_ptr(), sin.data_ptr(), table.pointers, dims, cache.pad_rows.data_ptr(),
        cache.prompt.data_ptr(), table.eps, table.scale, scratch.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return x


def reference_layer(
    w: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attend, *, heads: int, kv_heads: int
) -> torch.Tensor:
    """One layer as the kernel computes it, through PyTorch, with unpacked weights ``w`` (2-D ``[out, in]``):
    ``attend(q, k, v)`` gives the attention ``[rows, heads * d]`` (and keeps the step's K/V)."""
    n, d = x.shape[0], cos.shape[-1]
    h = F.rms_norm(x, x.shape[-1:], w.input_norm[0], w.input_norm[1])
    qkv = F.linear(h, *w.qkv[0]).view(n, heads + 2 * kv_heads, d)
    qk = qkv[:, : heads + kv_heads]
    qk = qk * cos[:, None] + torch.roll(qk, d // 2, dims=-1) * sin[:, None]
    x = x + F.linear(attend(qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads :]), *w.o_proj)
    h = F.rms_norm(x, x.shape[-1:], w.post_norm[0], w.post_norm[1])
    gate, up = F.linear(h, *w.gate_up[0]).chunk(2, dim=-1)
    return x + F.linear(F.silu(gate) * up, *w.down)


def _probe(lib: ctypes.CDLL) -> bool:
    """2 layers (hidden 32, intermediate 48, 4 query heads on 2 KV heads of 16 dims, biases on q/k/v) over 3
    rows of 2 prompts (one left-padded), 2 columns already decoded, against ``reference_layer``."""
    from ludic.kernels.cpu import decode_gemm  # the packed layout; compiled into the same library

    gen = torch.Generator().manual_seed(0)
    hidden, inter, heads, kv, d, width, max_new, rows, done = 32, 48, 4, 2, 16, 3, 4, 3, 2
    qkv_out = (heads + 2 * kv) * d

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) / math.sqrt(shape[-1])

    plain = [LayerWeights(input_norm=(1 + rand(hidden), 1e-5), qkv=[(rand(qkv_out, hidden), rand(qkv_out))], qk_norm=None,
                          o_proj=(rand(hidden, heads * d), None), post_norm=(1 + rand(hidden), 1e-5),
                          gate_up=[(rand(2 * inter, hidden), None)], down=(rand(hidden, inter), None)) for _ in range(2)]  # fmt: skip
    packed = [LayerWeights(input_norm=w.input_norm, qkv=[(decode_gemm._pack(w.qkv[0][0]), w.qkv[0][1])], qk_norm=None,
                           o_proj=(decode_gemm._pack(w.o_proj[0]), None), post_norm=w.post_norm,
                           gate_up=[(decode_gemm._pack(w.gate_up[0][0]), None)], down=(decode_gemm._pack(w.down[0]), None))
              for w in plain]  # fmt: skip
    prefill = SimpleNamespace(layers=[SimpleNamespace(keys=rand(2, kv, width, d), values=rand(2, kv, width, d)) for _ in plain])
    prompt_mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    cache = SharedPrefixKVCache(prefill, torch.tensor([0, 1, 1]), prompt_mask, max_new, native=True, groups=heads // kv)
    cache.suffix.copy_(rand(2, 2, rows, kv, max_new, d))
    angles = rand(rows, d // 2) * 3
    cos, sin = torch.cat((angles.cos(), angles.cos()), -1), torch.cat((-angles.sin(), angles.sin()), -1)
    x = rand(rows, hidden)
    want = x.clone()
    suffix = cache.suffix.clone()
    for i, w in enumerate(plain):
        def attend(q, k, v, i=i):
            suffix[i, 0, :, :, done], suffix[i, 1, :, :, done] = k, v
            pre_k, pre_v = cache.prefix[i]
            return decode_attention.reference(q, pre_k, pre_v, cache.pad_rows, cache.prompt, suffix[i, 0, :, :, : done + 1],
                                              suffix[i, 1, :, :, : done + 1], d**-0.5).float()  # fmt: skip
        want = reference_layer(w, want, cos, sin, attend, heads=heads, kv_heads=kv)
    table = _table(packed, cache, heads=heads, kv_heads=kv, head_dim=d, scale=d**-0.5)
    got = _run(lib, table, x.clone(), cos, sin, cache, width + done)
    return torch.allclose(got, want, atol=1e-4) and torch.allclose(cache.suffix, suffix, atol=1e-5)
