"""A weight update during a ``keep`` pause never mixes models: a request frozen mid-generation continues
on exactly the new model (its prompt and tokens so far prefilled again under the new weights, no K/V or
fused / packed copy of the old ones), and its ``weight_versions`` say which tokens came from which.

Every token's log-prob is checked against a forward pass of a plain ``transformers`` model holding the
weights that should have produced it: the old model before the pause, the new one after."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.inference import SamplingConfig, TransformersChatClient

PROMPT = [5, 6, 7, 8, 9]
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def new_state(dirs: tuple[Path, Path], change: str) -> dict[str, torch.Tensor]:
    """The update: model b's weights for the linear layers only, or for everything."""
    old = AutoModelForCausalLM.from_pretrained(dirs[0]).state_dict()
    other = AutoModelForCausalLM.from_pretrained(dirs[1]).state_dict()
    if change == "all":
        return {k: v for k, v in other.items() if k != "lm_head.weight"}  # tied to the embedding
    return {k: other[k] if any(f".{p}." in k for p in LINEAR) else v for k, v in old.items() if k != "lm_head.weight"}


def reference_logps(model_dir: Path, state: dict[str, torch.Tensor] | None, completion: list[int]) -> list[float]:
    """Each completion token's log-prob (T=1) under a fresh transformers model (with ``state`` loaded)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    if state is not None:
        model.load_state_dict(state, strict=False)
    with torch.no_grad():
        logps = torch.log_softmax(model(torch.tensor([PROMPT + completion])).logits.float(), -1)[0]
    return [float(logps[len(PROMPT) - 1 + i, t]) for i, t in enumerate(completion)]


async def generate_across_an_update(engine: TransformersChatClient, state: dict[str, torch.Tensor]):
    sampling = SamplingConfig(max_tokens=400, temperature=1.0, seed=3)
    task = asyncio.create_task(engine.complete_ids(PROMPT, sampling))
    start = engine.forward_calls
    while engine.forward_calls < start + 30:  # well into the decoding
        await asyncio.sleep(0.005)
    assert await engine.pause("keep") == 1
    await asyncio.to_thread(engine.sync_weights, state, version=1)
    engine.resume()
    return await task


@pytest.mark.parametrize("path", ["lean", "hf"])
@pytest.mark.parametrize("change", ["linear", "all"])
def test_tokens_after_a_keep_pause_update_come_from_exactly_the_new_model(dirs, change, path):
    engine = TransformersChatClient(dirs[0], generate_in_thread=True)
    if path == "hf":
        engine._generator.lean = None  # the model's own forward and DynamicCache
    state = new_state(dirs, change)
    response, info = asyncio.run(generate_across_an_update(engine, state))
    completion, served = response.completion_token_ids, response.completion_logprobs
    spans = info["weight_versions"]
    assert [s["version"] for s in spans] == ["0", "1"]
    k, n = spans[0]["end"], len(completion)
    assert 0 < k == spans[1]["start"] < n == spans[1]["end"] and n - k >= 10, (k, n)
    old = reference_logps(dirs[0], None, completion)
    new = reference_logps(dirs[0], state, completion)
    assert served[:k] == pytest.approx(old[:k], abs=1e-4)  # before the freeze: the old model
    assert served[k:] == pytest.approx(new[k:], abs=1e-4)  # after it: the new model, every token
    assert max(abs(a - b) for a, b in zip(old[k:], new[k:], strict=True)) > 1e-2  # and they differ


@pytest.mark.parametrize("serving", ["fold", "unmerged"])
@pytest.mark.parametrize("path", ["lean", "hf"])
def test_tokens_after_a_keep_pause_adapter_publish_come_from_exactly_the_adapted_model(dirs, path, serving):
    """An adapter is swapped in as new tensors (not written into the old ones): the frozen request must
    pick them up all the same, on both decoding paths."""
    from peft import LoraConfig, get_peft_model

    from ludic.distributed import adapter_payload
    from ludic.training._lora import merged_state_dict

    peft_model = get_peft_model(AutoModelForCausalLM.from_pretrained(dirs[0]),
                                LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=list(LINEAR)))  # fmt: skip
    gen = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    engine = TransformersChatClient(dirs[0], generate_in_thread=True, adapter_serving=serving)
    if path == "hf":
        engine._generator.lean = None
    response, info = asyncio.run(generate_across_an_update(engine, adapter_payload(peft_model)))
    completion, served = response.completion_token_ids, response.completion_logprobs
    k = info["weight_versions"][0]["end"]
    assert [s["version"] for s in info["weight_versions"]] == ["0", "1"] and len(completion) - k >= 10
    merged = {n: t for n, t in merged_state_dict(peft_model).items() if n != "lm_head.weight"}
    old, new = reference_logps(dirs[0], None, completion), reference_logps(dirs[0], merged, completion)
    assert served[:k] == pytest.approx(old[:k], abs=1e-4)
    assert served[k:] == pytest.approx(new[k:], abs=1e-4)
    assert max(abs(a - b) for a, b in zip(old[k:], new[k:], strict=True)) > 1e-2  # the adapter matters
