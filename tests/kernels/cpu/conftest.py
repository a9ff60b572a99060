"""Fixtures shared by the tests of Ludic's own C++ kernels."""

from __future__ import annotations

import pytest

from ludic.kernels.cpu import decode_attention, decode_gemm, decode_layers, native, rms_norm, swiglu


@pytest.fixture
def fresh_build(monkeypatch, tmp_path):
    """The kernels' library built and probed again, into ``tmp_path``, in this test; forgotten after it."""
    caches = (
        native.library, decode_gemm._KERNEL, decode_attention._KERNEL, decode_layers._KERNEL, swiglu._KERNEL,
        rms_norm._KERNEL,
    )
    monkeypatch.setenv(native.KERNELS_DIR_ENV, str(tmp_path))
    for cache in caches:
        cache.cache_clear()
    yield tmp_path
    for cache in caches:
        cache.cache_clear()
