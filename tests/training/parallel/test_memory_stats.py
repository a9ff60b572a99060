"""A CPU step reports resident memory now beside its peak, so flatness over steps can be read off metrics."""

from __future__ import annotations

import mmap

from ludic.training.parallel.step import DataParallelGroup


def test_cpu_perf_stats_carry_the_resident_memory_now_and_it_follows_an_allocation() -> None:
    group = DataParallelGroup(active=False)
    tokens = {"real_tokens": 1.0, "computed_tokens": 1.0, "distinct_tokens": 1.0, "num_micro_batches": 1.0}
    before = group.perf_stats(tokens, 1.0)
    # An anonymous mapping, every page written: malloc could serve a numpy array from heap pages that are
    # already resident in a long test process (CI's failure), so RSS would not move.
    size = 64 * 2**20
    block = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        block[offset] = 1
    during = group.perf_stats(tokens, 1.0)
    block.close()
    after = group.perf_stats(tokens, 1.0)
    assert 0 < before["perf/cpu_rss_mb"] <= during["perf/cpu_rss_peak_mb"]
    assert during["perf/cpu_rss_mb"] - before["perf/cpu_rss_mb"] > 60  # the 64 MiB shows up now ...
    assert during["perf/cpu_rss_mb"] - after["perf/cpu_rss_mb"] > 60  # ... and leaves when freed (the peak stays)
    assert after["perf/cpu_rss_peak_mb"] >= during["perf/cpu_rss_peak_mb"]  # the peak never falls
