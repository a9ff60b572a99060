"""Ludic's decoding matmul (AVX-512 or AVX2): ``F.linear``'s values to fp32 rounding at every shape the kernel
splits differently (row blocks of 8 (AVX-512) or 6 (AVX2) and their remainders, groups of 3 panels and the last smaller one,
the prefetching row blocks), its refusals, and the fallback to oneDNN where it cannot be built."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from ludic.kernels import select
from ludic.kernels.cpu import decode_attention, decode_gemm, lean_matmuls, native
from ludic.kernels.cpu.lean_decoder import LeanDecoder

needs_kernel = pytest.mark.skipif(
    native.unsupported() is not None, reason=f"the kernel cannot run here: {native.unsupported()}"
)


@pytest.fixture
def threads():
    """Runs the test body at 1 and at 2 torch threads (the kernel takes torch's count at each call)."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 3, 5, 8, 11, 13, 16, 21, 32, 40])
@pytest.mark.parametrize(("out_features", "in_features"), [(16, 5), (48, 64), (80, 33), (112, 96), (208, 7)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_equals_f_linear_to_fp32_rounding(rows, out_features, in_features, with_bias, threads):
    torch.manual_seed(rows * 1000 + out_features + in_features)
    x, weight = torch.randn(rows, in_features), torch.randn(out_features, in_features)
    bias = torch.randn(out_features) if with_bias else None
    ref = F.linear(x.double(), weight.double(), None if bias is None else bias.double())
    packed = decode_gemm.pack(weight)
    assert packed.shape == (out_features // 16, in_features, 16)
    for count in (1, 2):
        threads(count)
        got = decode_gemm.linear(x, packed, bias)
        assert got.shape == (rows, out_features) and got.dtype == torch.float32
        scale = x.abs().double() @ weight.abs().t().double() + (0 if bias is None else bias.abs().double())
        assert ((got.double() - ref).abs() <= 1e-6 * scale + 1e-6).all(), f"{count} threads"


@needs_kernel
def test_a_non_contiguous_input_gives_the_same_values():
    torch.manual_seed(0)
    wide, weight = torch.randn(9, 64), torch.randn(48, 32)
    x = wide[:, ::2]  # a strided view, as a chunk of a fused matmul's output is
    assert not x.is_contiguous()
    assert torch.equal(decode_gemm.linear(x, decode_gemm.pack(weight)), decode_gemm.linear(x.contiguous(), decode_gemm.pack(weight)))


@needs_kernel
def test_weights_and_inputs_it_cannot_take_are_refused_with_their_shape():
    with pytest.raises(ValueError, match=r"multiple of 16.*\(20, 8\)"):
        decode_gemm.pack(torch.randn(20, 8))
    with pytest.raises(ValueError, match="float64"):
        decode_gemm.pack(torch.randn(16, 8, dtype=torch.float64))
    packed = decode_gemm.pack(torch.randn(32, 8))
    with pytest.raises(ValueError, match=r"x \[4, 9\] does not fit a packed weight of shape \(2, 8, 16\)"):
        decode_gemm.linear(torch.randn(4, 9), packed)
    with pytest.raises(ValueError, match="float32 inputs"):
        decode_gemm.linear(torch.randn(4, 8, dtype=torch.float64), packed)


def _llama(vocab: int) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)  # fmt: skip
    return transformers.LlamaForCausalLM(config).eval()


@needs_kernel
@torch.inference_mode()
def test_the_lean_decoder_runs_its_matmuls_on_the_kernel_and_others_on_onednn():
    """Every layer's out_features is a multiple of 16 here, the vocabulary (97) is not: that one matmul
    keeps oneDNN's layout, and the logits still equal F.linear's path to fp32 rounding."""
    model = _llama(vocab=97)
    lean, plain = LeanDecoder(model), LeanDecoder(model, packed=False)
    assert lean.gemm and lean.linear is lean_matmuls.gemm_linear and not LeanDecoder(model, gemm=False).gemm
    _, layers, (_, _, head_w, _), _ = lean.bind(4)
    assert all(w.dim() == 3 for layer in layers for w, _ in (*layer.qkv, layer.o_proj, *layer.gate_up, layer.down))
    assert head_w.dim() == 2  # oneDNN's packed layout
    x = torch.randn(5, 64)
    for (w, b), (pw, pb) in zip(
        (*layers[0].qkv, layers[0].o_proj, *layers[0].gate_up), (*plain.bind(4)[1][0].qkv, plain.bind(4)[1][0].o_proj,
                                                                 *plain.bind(4)[1][0].gate_up), strict=True,
    ):  # fmt: skip
        assert (lean.linear(x, w, b) - F.linear(x, pw, pb)).abs().max() <= 1e-5


def test_without_a_compiler_the_engine_keeps_onednn_and_says_why_once(monkeypatch, fresh_build, caplog):
    monkeypatch.setenv("CXX", str(fresh_build / "no-such-compiler"))
    with caplog.at_level(logging.WARNING, logger="ludic.kernels.cpu.decode_gemm"):
        assert not decode_gemm.available() and not decode_gemm.available()
    reason = decode_gemm.unavailable_reason()
    assert reason is not None and ("could not be built" in reason or "not AVX2 or AVX-512" in reason or "x86-64" in reason)
    assert len([r for r in caplog.records if "decoding matmul kernel is off" in r.getMessage()]) == 1
    choice = select("cpu", "auto")
    assert not choice.decode_gemm and choice.packed_linear and choice.lean_decoder  # only this kernel falls back
    with pytest.raises(RuntimeError, match=r"decode_gemm kernel cannot run here: .*cpu_kernels='auto'"):
        select("cpu", "on")
    lean = LeanDecoder(_llama(vocab=96))
    assert lean.packed and not lean.gemm and lean.linear is lean_matmuls.packed_linear
    with pytest.raises(RuntimeError, match="the decoding matmul kernel is unavailable"):
        decode_gemm.pack(torch.randn(16, 4))


@needs_kernel
def test_a_corrupt_cached_library_is_rebuilt_not_loaded(fresh_build):
    target = native.library_path(native.compiler())
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(b"not a shared library")  # a truncated or foreign file under the kernel's name
    assert decode_gemm.available(), decode_gemm.unavailable_reason()
    assert decode_attention.available(), decode_attention.unavailable_reason()  # one library serves both
    assert target.read_bytes()[:4] == b"\x7fELF"
    assert [p.name for p in fresh_build.iterdir()] == [target.name]  # no temporary file left behind


@needs_kernel
def test_pack_concat_is_the_packed_concatenation_in_one_copy():
    weights = [torch.randn(48, 20), torch.randn(16, 20), torch.randn(32, 20)]  # q, k, v of one layer, say
    assert torch.equal(decode_gemm.pack_concat(weights), decode_gemm.pack(torch.cat(weights)))
    with pytest.raises(ValueError, match="one in_features"):
        decode_gemm.pack_concat([torch.randn(16, 20), torch.randn(16, 21)])
    with pytest.raises(ValueError, match="packable weights"):
        decode_gemm.pack_concat([torch.randn(16, 20), torch.randn(20, 20)])  # 20 rows: not whole panels
    lean = LeanDecoder(_llama(vocab=96))
    layer = lean.bind(4)[1][0]
    assert [w.dim() for w, _ in (*layer.qkv, *layer.gate_up)] == [3, 3]  # fused straight into the packed layout
    attn, mlp = lean.model.model.layers[0].self_attn, lean.model.model.layers[0].mlp
    fused_qkv = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert torch.equal(layer.qkv[0][0], decode_gemm.pack(fused_qkv))
    assert torch.equal(layer.gate_up[0][0], decode_gemm.pack(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])))


def test_the_library_is_named_by_its_headers_as_well_as_its_sources(monkeypatch, tmp_path):
    header = tmp_path / "shared.h"
    header.write_text("// one version\n")
    monkeypatch.setattr(native, "HEADERS", (header,))
    before = native.library_path("c++")
    header.write_text("// another\n")  # an edited shared header must not load a library built from the old one
    assert native.library_path("c++") != before
    assert {p.name for p in native.HEADERS} == {"shared.h"}
