"""The adapter base fingerprint samples tensors of any size (a real model's embedding has > 2**24 values)."""

from __future__ import annotations

import torch

from ludic.inference.weight_sync.adapter_config import SAMPLES_PER_TENSOR, _sample, base_fingerprint


def test_a_tensor_past_float32_integer_precision_is_sampled_to_its_last_value() -> None:
    n = 49152 * 576  # SmolLM2-135M's embedding: 28,311,552 values (a float32 linspace ended past it)
    tensor = torch.zeros(n, dtype=torch.uint8)
    tensor[-1] = 7
    picked = _sample(tensor)
    assert picked.numel() == SAMPLES_PER_TENSOR and int(picked[0]) == 0 and int(picked[-1]) == 7
    assert len(base_fingerprint([("embed", tensor)])) == 32


def test_small_tensors_are_taken_whole_and_samples_are_spread_evenly() -> None:
    small = torch.arange(10, dtype=torch.float32)
    assert torch.equal(_sample(small), small.to(torch.bfloat16))
    big = torch.arange(6301, dtype=torch.int64)  # (n - 1) / 63 = 100: exact positions 0, 100, ..., 6300
    assert _sample(big).tolist() == list(range(0, 6301, 100))
