"""The embedded engine bounds what one request may cost, so one bad or greedy request fails or waits only itself."""

from __future__ import annotations

import asyncio
import math
import time

import pytest
import torch

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.inference.embedded._generation import BatchGenerator, RowRequest
from ludic.kernels.cpu.sampling_kernel import sample_with_logprobs
from ludic.testing import tiny_model_path


@pytest.fixture(scope="module")
def engine() -> TransformersChatClient:
    return TransformersChatClient(tiny_model_path(), generate_in_thread=True)  # the loop stays free meanwhile


def test_seeds_are_64_bit_signed_ints_and_others_are_refused_naming_the_field(engine):
    for seed in (2**64, 2**63, -(2**63) - 1):
        with pytest.raises(ValueError, match=r"seed must be a 64-bit signed int.*got"):
            SamplingConfig(seed=seed)
    for seed in (2**63 - 1, -(2**63)):  # the extremes still sample
        response, _ = asyncio.run(engine.complete_ids([5, 6], SamplingConfig(max_tokens=2, seed=seed)))
        assert len(response.completion_token_ids) >= 1


def test_temperatures_below_the_minimum_are_refused_and_the_minimum_gives_finite_logprobs(engine):
    for t in (1e-39, 5e-324, 1e-6):  # subnormal, the smallest float, just under MIN_TEMPERATURE
        with pytest.raises(ValueError, match=r"MIN_TEMPERATURE=1e-05.*send 0 for greedy"):
            SamplingConfig(temperature=t)
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=True)  # a bool is not a temperature
    coolest, _ = asyncio.run(engine.complete_ids([5, 6, 7], SamplingConfig(temperature=1e-5, max_tokens=12, seed=0)))
    greedy, _ = asyncio.run(engine.complete_ids([5, 6, 7], SamplingConfig(temperature=0, max_tokens=12)))
    assert coolest.completion_token_ids == greedy.completion_token_ids
    assert all(math.isfinite(lp) for lp in coolest.completion_logprobs)
    logits = torch.tensor([[60.0, -40.0, 59.9999]])  # far apart at T=1e-5: 6e6 and -4e6
    tokens, logps = sample_with_logprobs(logits, torch.tensor([[1e-5, 1.0]]), torch.tensor([0.5]))
    assert tokens.tolist() == [0] and torch.isfinite(logps).all()


def test_stop_strings_are_bounded_by_count_and_total_length():
    SamplingConfig(stop=["x"] * 64)
    SamplingConfig(stop=["y" * 2048] * 2)
    with pytest.raises(ValueError, match="has 65 strings: at most MAX_STOP_STRINGS=64"):
        SamplingConfig(stop=["x"] * 65)
    with pytest.raises(ValueError, match="holds 4098 characters: at most MAX_STOP_CHARS=4096"):
        SamplingConfig(stop=["y" * 2049] * 2)
    with pytest.raises(ValueError, match="stop must be a string or a list of strings, got dict"):
        SamplingConfig(stop={"a": 1})  # type: ignore[arg-type]


class CountingTokenizer:
    """The real tokenizer, counting how many token ids ``decode`` is handed."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **kw):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kw)


@pytest.mark.parametrize("lean", [True, False])
def test_stop_matching_decodes_each_token_a_bounded_number_of_times(engine, lean):
    counting = CountingTokenizer(engine.tokenizer)
    generator = BatchGenerator(engine.model, counting, set(), engine._pad_id(), engine.device, lean=lean)
    sampling = SamplingConfig(temperature=0, max_tokens=300, stop=["never-in-a-random-models-text"] * 64)
    [result] = generator.generate([RowRequest([5, 6, 7], sampling)])
    assert len(result.completion_ids) == 300 and result.finish_reason == "length"
    assert counting.decoded <= 16 * 300  # at most 8 ids twice a step; the whole completion each step: 45,000


def test_a_stop_string_across_several_tokens_cuts_where_a_full_search_would(engine):
    free, _ = asyncio.run(engine.complete_ids([5, 6, 7], SamplingConfig(temperature=0, max_tokens=60)))
    text = free.text
    stop = text[30:34]  # byte tokens: four tokens' worth of text
    assert len(stop) == 4
    cut, _ = asyncio.run(engine.complete_ids([5, 6, 7], SamplingConfig(temperature=0, max_tokens=60, stop=[stop])))
    assert cut.finish_reason == "stop"
    assert cut.text == text[: text.find(stop)]


async def test_a_short_request_is_answered_while_a_long_one_still_decodes(engine):
    alone, _ = await engine.complete_ids([9, 9], SamplingConfig(max_tokens=6, seed=3))
    long_task = asyncio.create_task(engine.complete_ids([5, 6, 7], SamplingConfig(temperature=0, max_tokens=400)))
    start = engine.forward_calls
    while engine.forward_calls < start + 5:  # the long request is decoding
        await asyncio.sleep(0.005)
    began = time.perf_counter()
    joined, _ = await engine.complete_ids([9, 9], SamplingConfig(max_tokens=6, seed=3))
    waited = time.perf_counter() - began
    long_running = not long_task.done()
    long_response, _ = await long_task
    total = time.perf_counter() - began
    # Before: the short request waited for all 400 of the long one's steps (1.4 s for 2,040 tokens).
    assert long_running, f"the short request was answered only after the long one ({waited:.2f}s)"
    assert waited < 1.0 and waited < total / 2, (waited, total)
    assert joined.completion_token_ids == alone.completion_token_ids  # same seed, same tokens, whoever it joined
    assert long_response.finish_reason == "length" and len(long_response.completion_token_ids) == 400


def test_a_chat_too_long_for_the_context_is_refused_before_templating(engine):
    request = ChatCompletionRequest(model="t", messages=[{"role": "user", "content": "a" * 2_000_000}],
                                    sampling=SamplingConfig(max_tokens=4))  # fmt: skip
    began = time.perf_counter()
    with pytest.raises(ValueError, match=r"at least .* tokens .* max_position_embeddings 2048"):
        asyncio.run(engine.complete(request))
    assert time.perf_counter() - began < 1.0  # templating and tokenising 2 MB took ~5 s here


async def test_a_failure_outside_any_row_fails_the_waiting_requests_and_the_engine_serves_on():
    engine = TransformersChatClient(tiny_model_path(), generate_in_thread=True)
    bind = engine._generator.bind

    def broken(rows: int):
        engine._generator.bind = bind  # fails once
        raise RuntimeError("injected: binding the weights failed")

    engine._generator.bind = broken  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="injected"):
        await asyncio.wait_for(engine.complete_ids([5, 6], SamplingConfig(max_tokens=2)), timeout=30)
    response, _ = await engine.complete_ids([5, 6], SamplingConfig(max_tokens=2))
    assert len(response.completion_token_ids) >= 1


def test_a_chat_of_too_many_messages_is_refused_before_templating_and_a_long_render_before_tokenising(engine):
    def chat(n: int) -> ChatCompletionRequest:
        return ChatCompletionRequest(model="t", messages=[{"role": "user", "content": ""}] * n,
                                     sampling=SamplingConfig(max_tokens=4))  # fmt: skip

    began = time.perf_counter()
    with pytest.raises(ValueError, match="chat has 200000 messages: at most MAX_CHAT_MESSAGES=16384"):
        asyncio.run(engine.complete(chat(200_000)))  # rendering and tokenising them took 16 s here
    assert time.perf_counter() - began < 1.0
    with pytest.raises(ValueError, match=r"the rendered chat hold \d+ characters, at least \d+ tokens"):
        asyncio.run(engine.complete(chat(16_000)))  # empty messages: only the template's text is long
