"""Gloo broadcasts spread over several connections (channels) deliver every byte, in place."""

from __future__ import annotations

import threading

import pytest
import torch

from ludic.inference.weight_sync.process_group import (
    SPLIT_BYTES,
    broadcast_all,
    create_group,
    free_port,
    parts,
)


def test_parts_split_large_tensors_into_byte_ranges_that_cover_them_exactly():
    big = torch.arange(3 * SPLIT_BYTES // 4 + 5, dtype=torch.float32)  # 3 MiB + 20 bytes: 3 uneven parts
    pieces = parts(big, 3)
    assert len(pieces) == 3 and sum(p.numel() for p in pieces) == big.numel() * 4
    assert all(p.untyped_storage().data_ptr() == big.untyped_storage().data_ptr() for p in pieces)  # views
    assert torch.equal(torch.cat(pieces), big.view(torch.uint8))
    assert len(parts(big, 4)) == 1  # under 4 x 1 MiB: sent whole
    assert len(parts(big, 1)) == 1


@pytest.mark.parametrize("channels", [1, 3])
def test_broadcast_all_over_channels_delivers_bit_identical_tensors(channels):
    gen = torch.Generator().manual_seed(0)
    sent = [torch.randn(1000, 1024, generator=gen),  # 4 MB: split on 3 channels
            torch.randn(7, generator=gen).to(torch.bfloat16),  # tiny: whole
            torch.randint(-9, 9, (3 * SPLIT_BYTES // 8 + 1,), generator=gen)]  # int64, an odd size: split
    got = [torch.zeros_like(t) for t in sent]
    port, errors = free_port(), []

    def rank(r: int, tensors: list[torch.Tensor]) -> None:
        try:
            group = create_group("127.0.0.1", port, r, 2, backend="gloo", timeout_s=20, channels=channels)
            broadcast_all(group, tensors, timeout_s=20, channels=channels)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r, ts)) for r, ts in ((0, sent), (1, got))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
    assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(sent, got, strict=True))


def test_bad_channel_counts_are_refused():
    with pytest.raises(ValueError, match="channels must be an int from 1 to 16"):
        create_group("127.0.0.1", free_port(), 0, 2, backend="gloo", timeout_s=1, channels=0)
    with pytest.raises(ValueError, match="for gloo"):
        create_group("127.0.0.1", free_port(), 0, 2, backend="nccl", timeout_s=1, channels=2)
