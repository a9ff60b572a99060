"""Adapters the embedded engine must refuse in both serving modes, with the old weights left serving."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
import torch

from ludic.distributed import adapter_payload
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.embedded.adapters import AdapterRefused
from ludic.inference.weight_sync.adapter_config import AdapterPayload
from ludic.testing.lora import trained_lora_model

PROMPT = [5, 6, 7, 8, 9, 10, 11]


def served(engine: TransformersChatClient) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in engine.model.state_dict().items()}


def sample(engine: TransformersChatClient) -> tuple[list[int], list[float]]:
    response, _ = asyncio.run(engine.complete_ids(PROMPT, SamplingConfig(max_tokens=8, temperature=1.0, seed=4)))
    return response.completion_token_ids, response.completion_logprobs


def same_sample(a: tuple[list[int], list[float]], b: tuple[list[int], list[float]]) -> bool:
    """The same tokens, and log-probs equal to fp32 rounding: the engine's intra-op thread count follows the
    machine's load (``kernels/cpu/threads.py``), and another count sums in another order (up to 5e-7 apart beside
    two busy processes); the adapter's scaling 1% larger moves them by 3.4e-5."""
    return a[0] == b[0] and a[1] == pytest.approx(b[1], abs=3e-6)


def with_scalings(payload: AdapterPayload, scaling: float) -> AdapterPayload:
    config = dataclasses.replace(payload.config, scalings=(scaling,) * len(payload.config.scalings))
    return AdapterPayload(dict(payload), config)


@pytest.mark.parametrize("mode", ["fold", "unmerged"])
def test_a_scaling_that_is_inf_in_the_served_dtype_is_refused(dirs, mode):
    """1e300 is a finite float, but inf in float32: folded, every adapted weight became inf or NaN; unmerged,
    every adapted layer's output."""
    engine = TransformersChatClient(dirs[0], adapter_serving=mode)
    good = adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1))
    engine.sync_adapter(good, version=3)
    before, tokens = served(engine), sample(engine)
    with pytest.raises(AdapterRefused, match=r"scaling 1e\+300 of 'model.layers.0.self_attn.q_proj' is out of"):
        engine.sync_adapter(with_scalings(good, 1e300), version=4)
    assert engine.policy_version == 3 and engine.adapter.config == good.config
    assert all(torch.equal(v, before[k]) for k, v in served(engine).items()) and same_sample(sample(engine), tokens)


def test_folding_into_a_weight_tied_to_another_is_refused_and_unmerged_serves_it(dirs):
    """The tiny model's ``lm_head`` shares its weight with the embedding: peft adapts the head only, a fold
    adapted both (the served model was not the trained one). Unmerged, only the head's output changes."""
    model = trained_lora_model(dirs[0], ["lm_head"], seed=2, scale=0.1)
    payload = adapter_payload(model)
    folded = TransformersChatClient(dirs[0])
    before = served(folded)
    with pytest.raises(AdapterRefused, match=r"'lm_head', whose weight is tied to 'model\.embed_tokens\.weight'"):
        folded.sync_adapter(payload, version=1)
    assert folded.policy_version == 0 and all(torch.equal(v, before[k]) for k, v in served(folded).items())
    unmerged = TransformersChatClient(dirs[0], adapter_serving="unmerged")
    unmerged.sync_adapter(payload, version=1)
    completion, logps = sample(unmerged)
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([PROMPT + completion])).logits.float(), -1)[0]
    assert logps == pytest.approx([float(expected[len(PROMPT) - 1 + i, t]) for i, t in enumerate(completion)], abs=1e-4)


def test_layout_checks_keep_one_layout_whatever_a_publisher_sends(dirs):
    """Each new (targets, rank) was kept for good: a token-holding publisher cycling through layouts grew the
    server's memory. The last layout is kept; an earlier one is worked out again and still checks."""
    engine = TransformersChatClient(dirs[0])
    state = engine.adapter
    config = adapter_payload(trained_lora_model(dirs[0], ["q_proj"], seed=1)).config
    layouts = [dataclasses.replace(config, rank=r) for r in (2, 3, 4, 5)]
    metas = [state.expected_metas(engine.model, c) for c in layouts]
    assert len(state._metas) == 1
    assert state.expected_metas(engine.model, layouts[0]) == metas[0]
    assert [m.shape[0] for m in metas[2][::2]] == [4] * len(metas[2][::2])
