"""Adapters whose every number is finite but whose served model would be broken: refused in both serving modes
(issue 37, defects 1 and 7), with the old adapter left serving; an ordinary adapter near the bounds still serves."""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from ludic.distributed import adapter_payload
from ludic.inference import TransformersChatClient
from ludic.inference.embedded.adapters import AdapterRefused
from ludic.inference.weight_sync.adapter_config import AdapterPayload
from ludic.testing.lora import trained_lora_model

from .test_adapter_refusals import same_sample, sample, served

MAX_SCALING = 1e4  # ludic.inference.embedded.adapters.MAX_SCALING (kept literal: the test states the promise)


def scaled(payload: AdapterPayload, factor: float) -> AdapterPayload:
    return AdapterPayload({k: v * factor for k, v in payload.items()}, payload.config)


@pytest.mark.parametrize("mode", ["fold", "unmerged"])
def test_a_product_that_overflows_is_refused_in_both_modes(dirs, mode):
    """A and B each finite (x1e20: ~1e18 in float32), scaling 2: B @ A is ~1e36 * r * 2, inf in float32."""
    engine = TransformersChatClient(dirs[0], adapter_serving=mode)
    good = adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1))
    engine.sync_adapter(good, version=3)
    before, tokens = served(engine), sample(engine)
    bad = scaled(good, 1e20)
    assert all(torch.isfinite(t).all() for t in bad.values())
    with pytest.raises(AdapterRefused, match=r"scaling \* B @ A overflows"):
        engine.sync_adapter(bad, version=4)
    assert engine.policy_version == 3 and engine.adapter.config == good.config
    assert all(torch.equal(v, before[k]) for k, v in served(engine).items()) and same_sample(sample(engine), tokens)


@pytest.mark.parametrize("mode", ["fold", "unmerged"])
@pytest.mark.parametrize("scaling", [1e30, -1e30, MAX_SCALING * 1.01])
def test_a_finite_but_huge_scaling_is_refused_naming_it(dirs, mode, scaling):
    engine = TransformersChatClient(dirs[0], adapter_serving=mode)
    good = adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1))
    engine.sync_adapter(good, version=3)
    tokens = sample(engine)
    huge = AdapterPayload(dict(good), dataclasses.replace(good.config, scalings=(scaling,) * len(good.config.scalings)))
    with pytest.raises(AdapterRefused, match=re.escape(f"adapter scaling {scaling:g} of ") + r"'model\.layers\.0\.self_attn\.q_proj' is above"):
        engine.sync_adapter(huge, version=4)
    assert engine.policy_version == 3 and same_sample(sample(engine), tokens)


def test_an_adapter_at_the_scaling_bound_still_serves(dirs):
    engine = TransformersChatClient(dirs[0], adapter_serving="unmerged")
    good = adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1))
    small = scaled(good, 1e-3)
    engine.sync_adapter(AdapterPayload(dict(small), dataclasses.replace(good.config, scalings=(MAX_SCALING,) * len(good.config.scalings))), version=1)
    assert engine.policy_version == 1


def test_the_overflow_check_is_exact_past_its_bound():
    from ludic.inference.embedded.unmerged import LoraTerm, overflows

    """Past the cheap bound (|scaling| * r * max|A| * max|B|) the product itself decides."""
    a = torch.tensor([[1e20, 1e20]], dtype=torch.float32)  # [r=1, in=2]
    b = torch.tensor([[1e20], [0.0]], dtype=torch.float32)  # [out=2, r=1]
    assert overflows(LoraTerm(a, b, 2.0))  # 2e40
    assert not overflows(LoraTerm(a * 1e-30, b, 2.0))  # 2e10: under the bound
    a2 = torch.tensor([[1e20, 0.0], [0.0, 1.0]])  # [r=2, in=2]
    b2 = torch.tensor([[1.0, 1e20]])  # [out=1, r=2]: the bound says 4e40, the product is [1e20, 1e20] * 2
    assert not overflows(LoraTerm(a2, b2, 2.0))
    assert overflows(LoraTerm(torch.full((1, 2), 300.0).half(), torch.full((2, 1), 300.0).half(), 1.0))  # 9e4 > 65504
