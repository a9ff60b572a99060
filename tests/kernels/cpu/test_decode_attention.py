"""Ludic's decoding attention kernel: float64 attention's values to fp32 rounding over a shared prompt and each
row's own tokens (padding, GQA groups, head sizes, strided inputs, 1 and 2 threads), the step's K/V written
where they belong and nowhere else, its refusals, and the fallback where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch

from ludic.kernels import select
from ludic.kernels.cpu import decode_attention, native
from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache

needs_kernel = pytest.mark.skipif(
    native.unsupported() is not None, reason=f"the kernel cannot run here: {native.unsupported()}"
)


def _case(rows: int, prompts: int, kv_heads: int, groups: int, d: int, width: int, max_new: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    fused = torch.randn(rows, (groups + 2) * kv_heads, d, generator=gen)  # q, k, v side by side, as the decoder's
    q, k, v = fused.split([groups * kv_heads, kv_heads, kv_heads], dim=1)  # strided rows
    k_pre = torch.randn(prompts, kv_heads, width, d, generator=gen)
    v_pre = torch.randn(prompts, kv_heads, width, d, generator=gen)
    bias = torch.zeros(prompts, width)
    for p in range(prompts):
        bias[p, : p % max(width, 1)] = float("-inf")  # prompt p left-padded by p columns (some real column stays)
    prompt = torch.randint(0, prompts, (rows,), generator=gen)
    k_suf = torch.randn(rows + 2, kv_heads, max_new, d, generator=gen)  # more rows allocated than live
    v_suf = torch.randn(rows + 2, kv_heads, max_new, d, generator=gen)
    return q, k, v, k_pre, v_pre, bias, prompt, k_suf, v_suf


@needs_kernel
@pytest.mark.parametrize(("rows", "prompts", "kv_heads", "groups", "d"),
                         [(1, 1, 1, 1, 16), (5, 2, 2, 3, 16), (32, 4, 3, 3, 64), (7, 3, 2, 4, 128), (9, 2, 1, 7, 48)])  # fmt: skip
@pytest.mark.parametrize(("width", "column"), [(1, 0), (6, 0), (17, 5), (40, 33)])
@pytest.mark.parametrize("threads", [1, 2])
def test_equals_float64_attention_to_fp32_rounding(rows, prompts, kv_heads, groups, d, width, column, threads):
    q, k, v, k_pre, v_pre, bias, prompt, k_suf, v_suf = _case(rows, prompts, kv_heads, groups, d, width, column + 3)
    before_k, before_v = k_suf.clone(), v_suf.clone()
    torch.set_num_threads(threads)
    try:
        got = decode_attention.attend(q, k, v, k_pre, v_pre, bias, prompt, k_suf, v_suf, column, d**-0.5)
    finally:
        torch.set_num_threads(2)
    # the step's K/V land at `column` of the live rows; every other entry is untouched
    expect_k, expect_v = before_k.clone(), before_v.clone()
    expect_k[:rows, :, column], expect_v[:rows, :, column] = k, v
    assert torch.equal(k_suf, expect_k) and torch.equal(v_suf, expect_v)
    want = decode_attention.reference(
        q, k_pre, v_pre, bias, prompt, k_suf[:rows, :, : column + 1], v_suf[:rows, :, : column + 1], d**-0.5
    )
    assert got.shape == (rows, kv_heads * groups * d) and got.dtype == torch.float32
    assert (got.double() - want).abs().max() < 2e-6


@needs_kernel
def test_padding_columns_get_no_weight_and_large_scores_stay_finite():
    q, k, v, k_pre, v_pre, bias, prompt, k_suf, v_suf = _case(4, 2, 1, 2, 16, 5, 4)
    v_pre[:, :, :1] = 1e30  # a padding column's value: weight exactly 0 must keep it out
    bias[:] = 0.0
    bias[:, 0] = float("-inf")
    q.mul_(40.0)  # scores in the hundreds: the softmax must subtract its max
    got = decode_attention.attend(q, k, v, k_pre, v_pre, bias, prompt, k_suf, v_suf, 2, 0.125)
    want = decode_attention.reference(q, k_pre, v_pre, bias, prompt, k_suf[:4, :, :3], v_suf[:4, :, :3], 0.125)
    assert torch.isfinite(got).all()
    assert (got.double() - want).abs().max() / want.abs().max() < 1e-6


@needs_kernel
def test_refuses_what_it_cannot_read_naming_it():
    q, k, v, k_pre, v_pre, bias, prompt, k_suf, v_suf = _case(3, 2, 1, 2, 16, 4, 5)
    args = [q, k, v, k_pre, v_pre, bias, prompt, k_suf, v_suf]

    def call(**changes):
        names = ["q", "k_new", "v_new", "k_pre", "v_pre", "pre_bias", "prompt", "k_suf", "v_suf"]
        given = dict(zip(names, args, strict=True)) | changes
        return decode_attention.attend(**given, column=changes.pop("column", 1), scale=0.25)

    with pytest.raises(ValueError, match="float32 CPU tensors"):
        call(q=q.double())
    with pytest.raises(ValueError, match="int64 prompt"):
        call(prompt=prompt.int())
    with pytest.raises(ValueError, match="prompt indices must be in"):
        call(prompt=torch.tensor([0, 2, 1]))  # only 2 prompts: an index past them would read past k_pre
    with pytest.raises(ValueError, match="shapes do not fit"):
        decode_attention.attend(q, k, v, k_pre, v_pre, bias, prompt, k_suf, v_suf, 5, 0.25)  # max_new is 5
    with pytest.raises(ValueError, match="must be contiguous"):
        call(k_pre=k_pre.transpose(2, 3).contiguous().transpose(2, 3))
    with pytest.raises(ValueError, match="not supported"):
        q24 = torch.randn(3, 2, 24)
        k24 = torch.randn(3, 1, 24)
        decode_attention.attend(q24, k24, k24, torch.randn(2, 1, 4, 24), torch.randn(2, 1, 4, 24), bias, prompt,
                                torch.randn(3, 1, 5, 24), torch.randn(3, 1, 5, 24), 1, 0.25)  # fmt: skip
    assert decode_attention.supports(64, 3) and decode_attention.supports(128, 16)
    assert not decode_attention.supports(24, 3) and not decode_attention.supports(64, 17)


def test_without_a_compiler_the_cache_keeps_two_sdpa_calls_and_says_why_once(monkeypatch, fresh_build, caplog):
    monkeypatch.setenv("CXX", str(fresh_build / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="ludic.kernels.cpu.decode_attention"):
        assert not decode_attention.available() and not decode_attention.available()
    assert len([r for r in caplog.records if "decoding attention kernel is off" in r.getMessage()]) == 1
    choice = select("cpu", "auto")
    assert not choice.decode_attention and choice.shared_prefix_cache  # only the kernel falls back
    with pytest.raises(RuntimeError, match=r"kernel cannot run here: .*cpu_kernels='auto'"):
        select("cpu", "on")
    with pytest.raises(RuntimeError, match="the decoding attention kernel is unavailable"):
        decode_attention.attend(*_case(2, 1, 1, 1, 16, 3, 4), 0, 0.25)


@torch.inference_mode()
def test_the_cache_asked_for_the_kernel_keeps_torchs_path_for_heads_it_does_not_take():
    import types

    layers = [types.SimpleNamespace(keys=torch.randn(2, 1, 5, 24), values=torch.randn(2, 1, 5, 24))]
    cache = SharedPrefixKVCache(types.SimpleNamespace(layers=layers), torch.tensor([0, 1, 0]), torch.ones(2, 5), 4,
                                native=True, groups=2)  # fmt: skip
    assert not cache.native  # head_dim 24: two SDPA calls, as without the kernel
    cache.begin(5)
    out = cache.attend(0, torch.randn(3, 2, 24), torch.randn(3, 1, 24), torch.randn(3, 1, 24), 0.2)
    assert out.shape == (3, 48) and torch.isfinite(out).all()
