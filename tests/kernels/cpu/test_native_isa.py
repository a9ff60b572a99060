"""``ludic.kernels.cpu.native``: one library per instruction set (``simd16.h``: AVX-512 or AVX2), the widest
this CPU runs unless ``$LUDIC_KERNELS_ISA`` asks for another it runs; every build gives PyTorch's values to fp32
rounding; ``off`` keeps every kernel on its PyTorch path; a set this CPU lacks or an unknown name is refused
by name."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from ludic.kernels.cpu import decode_gemm, native, rms_norm, swiglu


def test_the_widest_set_this_cpu_runs_is_chosen_unless_one_is_asked_for(monkeypatch):
    capability = {"AVX512": ("avx512", "avx2"), "AVX2": ("avx2",), "DEFAULT": ()}
    monkeypatch.delenv(native.ISA_ENV, raising=False)
    for torch_level, runs in capability.items():  # what torch dispatches to on a CPU stands in for the CPU
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda level=torch_level: level)
        assert native.cpu_isas() == runs and native.isa() == next(iter(runs), None)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setenv(native.ISA_ENV, "avx2")
    assert native.isa() == "avx2" and native.flags()[1:3] == ("-mavx2", "-mfma")


def test_a_set_this_cpu_lacks_or_an_unknown_name_is_refused_by_name(monkeypatch):
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setenv(native.ISA_ENV, "avx512")
    assert native.isa() is None
    assert native.unsupported() == "$LUDIC_KERNELS_ISA=avx512 asks for instructions this CPU lacks (torch runs its AVX2 kernels)"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    monkeypatch.delenv(native.ISA_ENV)
    assert native.unsupported() == "this CPU runs torch's DEFAULT kernels, not AVX2 or AVX-512"
    monkeypatch.setenv(native.ISA_ENV, "off")  # every kernel on its PyTorch path (a bench's baseline)
    assert native.isa() is None and native.unsupported() == "$LUDIC_KERNELS_ISA=off"
    monkeypatch.setenv(native.ISA_ENV, "sse4")
    with pytest.raises(ValueError, match=r"\$LUDIC_KERNELS_ISA='sse4': expected auto, avx512, avx2 or off"):
        native.isa()


@pytest.mark.skipif(native.unsupported() is not None, reason=f"no kernels here: {native.unsupported()}")
@pytest.mark.parametrize("isa", native.cpu_isas())
def test_each_set_this_cpu_runs_builds_its_own_library_with_pytorchs_values(isa, monkeypatch, fresh_build):
    monkeypatch.setenv(native.ISA_ENV, isa)
    lib, reason = native.library()
    assert reason is None and f"ludic_kernels-{isa}-" in lib._name
    assert [p.name for p in fresh_build.iterdir()] == [native.library_path(native.compiler()).name]
    torch.manual_seed(0)
    x, weight, bias = torch.randn(11, 72), torch.randn(80, 72), torch.randn(80)
    ref = F.linear(x.double(), weight.double(), bias.double())
    assert (decode_gemm.linear(x, decode_gemm.pack(weight), bias).double() - ref).abs().max() < 1e-4
    g, u, dp = torch.randn(3, 50) * 4, torch.randn(3, 50), torch.randn(3, 50)  # 150 values: a masked tail
    assert torch.allclose(swiglu.forward(g, u), F.silu(g) * u, rtol=1e-5, atol=1e-6)
    want_p, want_du, want_dg = swiglu.reference(g, u, dp)
    p, du, dg = swiglu.backward(g, u, dp)  # dg written over dp
    assert all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in ((p, want_p), (du, want_du), (dg, want_dg)))
    w = torch.randn(50)
    y, _ = rms_norm.forward(g, w, 1e-6)
    assert torch.allclose(y, w * g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-6), rtol=1e-5, atol=1e-6)
