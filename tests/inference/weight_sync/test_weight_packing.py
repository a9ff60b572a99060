"""pack / unpack: tensors into one aligned byte buffer and back, bit for bit, with or without padding."""

from __future__ import annotations

import pytest
import torch

from ludic.inference.weight_sync.packing import TensorMeta, pack, packed_size, unpack


@pytest.mark.parametrize(
    "shapes_dtypes",
    [
        [((16, 8), torch.float32), ((8, 16), torch.float32), ((4,), torch.float32)],  # back to back: one cat
        [((3, 5), torch.float32), ((7,), torch.bfloat16), ((2, 3), torch.int64), ((0,), torch.float32)],  # padded
    ],
)
def test_packed_tensors_come_back_bit_for_bit_into_a_reused_buffer(shapes_dtypes):
    gen = torch.Generator().manual_seed(0)
    tensors = [(torch.randn(s, generator=gen) * 100).to(d) for s, d in shapes_dtypes]
    metas = [TensorMeta.of(f"t{i}", t) for i, t in enumerate(tensors)]
    out = torch.full((packed_size(metas) + 64,), 255, dtype=torch.uint8)  # larger than needed, dirty
    buffer = pack(tensors, "cpu", out=out)
    assert buffer.numel() == packed_size(metas) and buffer.data_ptr() == out.data_ptr()
    back = unpack(buffer, metas)
    assert all(torch.equal(back[f"t{i}"], t) and back[f"t{i}"].dtype == t.dtype for i, t in enumerate(tensors))
    transposed = [tensors[0].t(), tensors[1]]  # a non-contiguous view packs as its values in row order
    assert torch.equal(unpack(pack(transposed), [TensorMeta.of("a", transposed[0]), metas[1]])["a"], transposed[0])


def test_packing_nothing_gives_an_empty_buffer():
    assert pack([]).numel() == 0
