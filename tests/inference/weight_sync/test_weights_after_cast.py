"""The NaN/inf check of a weight update runs on the values as the model will store them: after the cast
to the model's dtype (a float64 1e300 becomes inf in float32, a 7e4 becomes inf in float16)."""

from __future__ import annotations

import asyncio
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.weight_sync.finite_check import FiniteCheck
from ludic.inference.weight_sync.weights import first_non_finite
from ludic.testing import tiny_model_path

NORM = "model.norm.weight"


@pytest.mark.parametrize(
    ("value", "sent", "model", "bad"),
    [
        (1e300, torch.float64, torch.float32, True),
        (1e300, torch.float64, torch.float64, False),
        (7e4, torch.float32, torch.float16, True),
        (65519.0, torch.float32, torch.float16, False),  # rounds down to float16's max, 65504
        (65520.0, torch.float32, torch.float16, True),  # rounds up to inf
        (3.4e38, torch.float32, torch.bfloat16, True),
        (7e4, torch.float32, torch.float32, False),
        (7e4, torch.float16, torch.float32, False),  # float16 cannot hold 7e4: it is inf as sent
    ],
)
def test_a_value_that_overflows_the_models_dtype_counts_as_inf(value, sent, model, bad):
    tensor = torch.ones(100, dtype=torch.float64).mul_(0.5)
    tensor[37] = -value
    tensor = tensor.to(sent)
    if not math.isfinite(float(tensor[37])):
        bad = True
    assert (first_non_finite({"w": tensor}, {"w": model}) == "w") is bad


def test_the_servers_background_check_casts_too():
    with ThreadPoolExecutor(1) as pool:
        check = FiniteCheck(pool, {"a": torch.float32, "b": torch.float16})
        check.add({"a": torch.full((8,), 7e4), "b": torch.full((8,), 7e4)})
        assert check.first_bad() == "b"


def greedy(engine: TransformersChatClient) -> tuple[list[float], int]:
    async def go():
        response, info = await engine.complete_ids([5, 6, 7], SamplingConfig(max_tokens=6, temperature=0.0))
        return response.completion_logprobs, info["policy_version"]

    return asyncio.run(go())


@pytest.mark.parametrize(("engine_dtype", "sent", "value"), [("float32", torch.float64, 1e300), ("float16", torch.float32, 7e4)])
def test_an_update_that_overflows_the_engines_dtype_is_refused_whole(engine_dtype, sent, value):
    engine = TransformersChatClient(tiny_model_path(), dtype=engine_dtype)
    before, version = greedy(engine)
    state = {k: v.to(sent) for k, v in engine.model.state_dict().items()}
    state["model.embed_tokens.weight"] = state["model.embed_tokens.weight"] * 0.5  # a change that must not land
    state[NORM] = state[NORM].clone()
    state[NORM][3] = value
    with pytest.raises(ValueError, match=rf"'{NORM}' contains NaN or inf values once cast from \w+ to the model's {engine_dtype}"):
        engine.sync_weights(state, version=5)
    after, after_version = greedy(engine)
    assert after_version == version == 0
    assert after == before and all(math.isfinite(x) for x in after)
