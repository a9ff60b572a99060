"""first_non_finite: the server's NaN/inf check on every received tensor (a sum first, min/max when it is not finite)."""

from __future__ import annotations

import pytest
import torch

from ludic.inference.weight_sync.weights import first_non_finite


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_any_nan_or_inf_is_found_by_name(dtype, bad):
    good, tainted = torch.randn(64, 32).to(dtype), torch.randn(1000).to(dtype)
    tainted[517] = bad
    assert first_non_finite({"a": good, "b": tainted, "c": good}) == "b"


def test_infinities_of_both_signs_that_sum_to_nan_are_found():
    tensor = torch.zeros(100)
    tensor[3], tensor[90] = float("inf"), -float("inf")
    assert first_non_finite({"w": tensor}) == "w"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_large_finite_values_whose_sum_overflows_are_finite(dtype):
    huge = torch.full((4096,), torch.finfo(dtype).max / 2, dtype=dtype)
    assert torch.isinf(huge.sum())  # the fast path's sum overflows; the exact check must clear it
    assert first_non_finite({"w": huge, "b": -huge}) is None


def test_integer_and_empty_tensors_are_skipped():
    assert first_non_finite({"steps": torch.arange(10), "empty": torch.empty(0), "w": torch.ones(3)}) is None


def test_many_small_tensors_checked_together_still_name_the_first_bad_one():
    """Small tensors are proved finite in one pass (an adapter's 112); a pass that fails, or a tensor a cast
    could overflow, falls back to naming the first bad tensor in order."""
    small = {f"layer{i}.lora_A.weight": torch.randn(4, 96) for i in range(112)}
    assert first_non_finite(small) is None
    small["layer57.lora_A.weight"][1, 2] = float("nan")
    small["layer90.lora_A.weight"][0, 0] = float("inf")
    assert first_non_finite(small) == "layer57.lora_A.weight"
    wide = {f"t{i}": torch.zeros(8, dtype=torch.float64) for i in range(6)} | {"t6": torch.full((8,), 1e300, dtype=torch.float64)}
    assert first_non_finite(wide) is None  # finite as float64
    assert first_non_finite(wide, dict.fromkeys(wide, torch.float32)) == "t6"  # but not once cast to float32
    huge = {f"h{i}": torch.full((1000,), 3e38) for i in range(4)}  # their sum overflows; every value is finite
    assert first_non_finite(huge) is None
