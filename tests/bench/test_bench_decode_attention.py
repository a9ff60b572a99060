"""``bench/bench_decode_attention.py``'s attention part runs and reports the kernel beside SDPA (values checked equal)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ludic.kernels.cpu import decode_attention

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))


@pytest.mark.skipif(not decode_attention.available(), reason=f"the kernel cannot run here: {decode_attention.unavailable_reason()}")
@pytest.mark.slow  # the bench's attention part: ~9 s
def test_the_attention_part_checks_both_paths_agree_and_reports_each_length():
    import bench_decode_attention as bench

    results = bench.attention_part(rounds=1)
    assert list(results) == ["49 keys", "73 keys", "104 keys"]
    for row in results.values():
        assert row["kernel_ms"] > 0 and row["sdpa_ms"] > 0
        assert row["speedup"] == pytest.approx(row["sdpa_ms"] / row["kernel_ms"], rel=0.02)
