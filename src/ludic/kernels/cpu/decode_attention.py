"""The decoding step's attention over a shared prompt and each row's own tokens, in one native call a layer.

``SharedPrefixKVCache`` keeps each distinct prompt's K/V once and each row's decoded tokens apart. Through
PyTorch its attention is two flash-attention calls a layer (the prompt part on a slot layout, the suffix
part per row), merged by their log-sum-exps, plus a dozen small ops to lay the queries out and back: at
SmolLM2-135M with 32 rows, 4 prompts of ~40 tokens and up to 64 decoded ones, 11-21 ms of a ~55 ms
decoding step (30 layers, 2 threads), three quarters of it in the two flash calls (each 44-190 us for a
few MFLOPs: the kernel's setup and its thread team, not arithmetic). This kernel (``decode_attention.cpp``)
does a layer's attention in one call: for every (row, KV head) pair it writes the step's K/V into the
row's suffix, scores its query heads against the prompt's keys (read once for all the heads of that KV
head) and its own, takes one softmax over both, and sums the values.

Values equal the PyTorch path to fp32 rounding (its own exponential, tests), not bit for bit. Built with
Ludic's other C++ kernels (``native.py``); ``available()`` is False, logged once, where they cannot be
built or this kernel gives other values than PyTorch's softmax on a probe; the cache then keeps its two
SDPA calls (``ludic.kernels.select``'s ``decode_attention``). ``supports`` names the head shapes it takes
(head_dim a multiple of 16 up to 256, at most 16 query heads per KV head).
"""

from __future__ import annotations

import ctypes
import logging

import torch

from ludic.kernels.cpu import native

logger = logging.getLogger(__name__)

MAX_HEAD_DIM = 256
MAX_GROUPS = 16


_KERNEL = native.ProbedKernel(
    lambda lib: _probe(lib), kernel="decoding attention", compared_with="PyTorch's attention",
    fallback="two SDPA calls a layer run instead", log=logger,
)  # fmt: skip
"""Loaded and probed against PyTorch once per process (``native.ProbedKernel``); a failure logged once."""
available = _KERNEL.available
unavailable_reason = _KERNEL.unavailable_reason
_lib = _KERNEL.lib


def supports(head_dim: int, groups: int) -> bool:
    """The kernel takes heads of ``head_dim`` with ``groups`` query heads per KV head."""
    return 0 < head_dim <= MAX_HEAD_DIM and head_dim % 16 == 0 and 0 < groups <= MAX_GROUPS


def reference(q, k_pre, v_pre, pre_bias, prompt, k_suf, v_suf, scale: float) -> torch.Tensor:
    """What ``attend`` computes, in PyTorch and float64: ``[rows, heads * head_dim]`` for ``q [rows,
    heads, d]``, the prompts' ``k_pre``/``v_pre [P, kv_heads, W, d]``, ``pre_bias [P, W]`` (or None),
    ``prompt [rows]`` and the rows' ``k_suf``/``v_suf [rows, kv_heads, T, d]`` (every column attended)."""
    n, heads, d = q.shape
    kv_heads = k_pre.shape[1]
    q = q.double().view(n, kv_heads, heads // kv_heads, d)
    keys = torch.cat((k_pre[prompt], k_suf), dim=2).double()  # [n, kv_heads, W + T, d]
    values = torch.cat((v_pre[prompt], v_suf), dim=2).double()
    s = torch.einsum("njgd,njtd->njgt", q, keys) * scale
    if pre_bias is not None:
        bias = torch.cat((pre_bias[prompt].double(), s.new_zeros(n, k_suf.shape[2])), dim=1)
        s = s + bias[:, None, None, :]
    out = torch.einsum("njgt,njtd->njgd", torch.softmax(s, dim=-1), values)
    return out.reshape(n, heads * d)


def _probe(lib: ctypes.CDLL) -> bool:
    """5 rows over 2 prompts (one left-padded), 2 KV heads of 3 query heads, 16 dims, 3 decoded columns."""
    gen = torch.Generator().manual_seed(0)
    n, kv_heads, groups, d, width, max_new = 5, 2, 3, 16, 4, 6
    q = torch.randn(n, kv_heads * groups, d, generator=gen)
    k_new, v_new = torch.randn(n, kv_heads, d, generator=gen), torch.randn(n, kv_heads, d, generator=gen)
    k_pre, v_pre = torch.randn(2, kv_heads, width, d, generator=gen), torch.randn(2, kv_heads, width, d, generator=gen)
    bias = torch.zeros(2, width)
    bias[1, :2] = float("-inf")
    prompt = torch.tensor([0, 1, 1, 0, 1])
    k_suf, v_suf = torch.randn(n, kv_heads, max_new, d, generator=gen), torch.randn(n, kv_heads, max_new, d, generator=gen)
    got = _attend(lib, q, k_new, v_new, k_pre, v_pre, bias, prompt, k_suf, v_suf, 2, 0.25)
    want = reference(q, k_pre, v_pre, bias, prompt, k_suf[:, :, :3], v_suf[:, :, :3], 0.25)
    return torch.equal(k_suf[:, :, 2], k_new) and torch.allclose(got, want.float(), atol=1e-5)


def attend(
    q: torch.Tensor,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    k_pre: torch.Tensor,
    v_pre: torch.Tensor,
    pre_bias: torch.Tensor | None,
    prompt: torch.Tensor,
    k_suf: torch.Tensor,
    v_suf: torch.Tensor,
    column: int,
    scale: float,
) -> torch.Tensor:
    """Write ``k_new``/``v_new [rows, kv_heads, d]`` at ``column`` of ``k_suf``/``v_suf`` and return the
    attention ``[rows, heads * d]`` of ``q [rows, heads, d]`` over the prompt (``k_pre``/``v_pre [P,
    kv_heads, W, d]``, ``pre_bias [P, W]`` with 0 or -inf, ``prompt [rows]`` each row's prompt) and the
    suffix columns ``[0, column]`` (``k_suf``/``v_suf [rows_allocated, kv_heads, max_new, d]``)."""
    return _attend(_lib(), q, k_new, v_new, k_pre, v_pre, pre_bias, prompt, k_suf, v_suf, column, scale)


def _check(q, k_new, v_new, k_pre, v_pre, pre_bias, prompt, k_suf, v_suf, column: int) -> None:
    n, heads, d = q.shape
    prompts, kv_heads, width, _ = k_pre.shape
    tensors = {"q": q, "k_new": k_new, "v_new": v_new, "k_pre": k_pre, "v_pre": v_pre, "k_suf": k_suf, "v_suf": v_suf}
    if pre_bias is not None:
        tensors["pre_bias"] = pre_bias
    wrong = [name for name, t in tensors.items() if t.dtype != torch.float32 or t.device.type != "cpu"]
    if wrong or prompt.dtype != torch.int64:
        raise ValueError(f"the kernel takes float32 CPU tensors and an int64 prompt index; not so: {wrong or ['prompt']}")
    if heads % kv_heads or not supports(d, heads // kv_heads):
        raise ValueError(f"heads {heads} over {kv_heads} KV heads of dim {d} are not supported (see supports())")
    shapes_ok = (
        k_new.shape == v_new.shape == (n, kv_heads, d) and v_pre.shape == k_pre.shape == (prompts, kv_heads, width, d)
        and k_suf.shape == v_suf.shape and k_suf.shape[0] >= n and k_suf.shape[1:2] == (kv_heads,)
        and k_suf.shape[3] == d and 0 <= column < k_suf.shape[2] and prompt.shape == (n,)
        and (pre_bias is None or pre_bias.shape == (prompts, width))
    )  # fmt: skip
    if not shapes_ok:
        raise ValueError(
            f"shapes do not fit: q {tuple(q.shape)}, k_new {tuple(k_new.shape)}, v_new {tuple(v_new.shape)}, "
            f"k_pre {tuple(k_pre.shape)}, k_suf {tuple(k_suf.shape)}, prompt {tuple(prompt.shape)}, column {column}"
        )
    rows_inner = [("q", q), ("k_new", k_new), ("v_new", v_new)]
    if any(t.stride(2) != 1 or t.stride(1) != d for _, t in rows_inner):
        raise ValueError("q, k_new and v_new need each row's heads contiguous ([rows, heads, d] with any row stride)")
    if not all(t.is_contiguous() for t in (k_pre, v_pre, k_suf, v_suf, prompt)) or (
        pre_bias is not None and not pre_bias.is_contiguous()
    ):
        raise ValueError("k_pre, v_pre, pre_bias, prompt, k_suf and v_suf must be contiguous")
    if n and (int(prompt.min()) < 0 or int(prompt.max()) >= prompts):
        raise ValueError(f"prompt indices must be in [0, {prompts})")


def _attend(lib, q, k_new, v_new, k_pre, v_pre, pre_bias, prompt, k_suf, v_suf, column: int, scale: float):
    _check(q, k_new, v_new, k_pre, v_pre, pre_bias, prompt, k_suf, v_suf, column)
    n, heads, d = q.shape
    _, kv_heads, width, _ = k_pre.shape
    out = torch.empty((n, heads * d), dtype=torch.float32)
    lib.ludic_decode_attention(
        q.data_ptr(), q.stride(0), k_new.data_ptr(), k_new.stride(0), v_new.data_ptr(), v_new.stride(0),
        k_pre.data_ptr(), v_pre.data_ptr(), None if pre_bias is None else pre_bias.data_ptr(), prompt.data_ptr(),
        k_suf.data_ptr(), v_suf.data_ptr(), k_suf.shape[2], column, n, kv_heads, heads // kv_heads, d, width,
        float(scale), out.data_ptr(), torch.get_num_threads(),
    )  # fmt: skip
    return out
