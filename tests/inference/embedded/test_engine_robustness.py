"""The embedded engine: one bad request fails alone, abandoned work is cancelled, options take effect."""

from __future__ import annotations

import asyncio

import pytest
import torch

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.inference.embedded.transformers_client import EngineOverloaded
from ludic.testing import tiny_model_path


@pytest.fixture(scope="module")
def client() -> TransformersChatClient:
    return TransformersChatClient(tiny_model_path(), generate_in_thread=True)  # the loop stays free to cancel


def ids_request(ids: list[int], **kw) -> ChatCompletionRequest:
    extras = kw.pop("extras", {})
    return_logprobs = kw.pop("return_logprobs", True)
    return ChatCompletionRequest(model="t", messages=[{"role": "user", "content": "-"}],
                                 sampling=SamplingConfig(**kw), prompt_token_ids=ids,
                                 return_logprobs=return_logprobs, extras=extras)  # fmt: skip


async def test_a_row_the_generator_rejects_fails_alone_and_its_batch_completes(client):
    vocab = client.model.get_input_embeddings().num_embeddings
    good = [client.complete(ids_request([5, 6, 7], max_tokens=4, seed=i)) for i in range(3)]
    bad = client.complete_ids([5, vocab + 3], SamplingConfig(max_tokens=4))  # skips the entry checks
    results = await asyncio.gather(*good, bad, return_exceptions=True)
    assert all(not isinstance(r, Exception) for r in results[:3])
    assert isinstance(results[3], IndexError)


async def test_entry_checks_name_the_problem(client):
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await client.complete(ids_request([5, 10**7], max_tokens=2))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        await client.complete(ids_request([5], max_tokens=10**6))
    with pytest.raises(ValueError, match="extras"):
        await client.complete(ids_request([5], max_tokens=2, extras={"top_k": 3}))


async def test_a_cancelled_request_stops_costing_forward_passes(client):
    task = asyncio.create_task(client.complete(ids_request([5, 6], max_tokens=1500, temperature=1.0, seed=0)))
    start = client.forward_calls
    while client.forward_calls < start + 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    after_cancel = client.forward_calls
    await client.complete(ids_request([5, 6], max_tokens=2, seed=1))  # waits for the batch to end
    assert client.forward_calls - after_cancel < 20  # not the ~1500 it asked for


async def test_return_logprobs_false_returns_none_and_the_queue_is_bounded():
    engine = TransformersChatClient(tiny_model_path(), max_pending=1, dtype="bfloat16")
    assert next(engine.model.parameters()).dtype == torch.bfloat16
    results = await asyncio.gather(
        *[engine.complete(ids_request([5, 6], max_tokens=3, return_logprobs=False)) for _ in range(3)],
        return_exceptions=True,
    )
    done = [r for r in results if not isinstance(r, Exception)]
    assert done and all(r[0].completion_logprobs is None for r in done)
    assert any(isinstance(r, EngineOverloaded) and "max_pending=1" in str(r) for r in results)
    with pytest.raises(ValueError, match="dtype"):
        TransformersChatClient(tiny_model_path(), dtype="float8")
