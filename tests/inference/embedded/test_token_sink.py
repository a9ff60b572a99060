"""The engine's streaming hook: ``on_token(position, id)`` hears every sampled token, in order, as it is sampled,
on both decoding paths and beside rows without a sink; a sink that raises is dropped, never failing the batch."""

from __future__ import annotations

import asyncio

import pytest

from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.embedded._generation import BatchGenerator, RowRequest
from ludic.testing import tiny_model_path


@pytest.fixture(scope="module")
def engine() -> TransformersChatClient:
    return TransformersChatClient(tiny_model_path(), generate_in_thread=True)


def test_a_sink_hears_the_whole_completion_in_order_before_the_answer(engine: TransformersChatClient) -> None:
    heard: list[tuple[int, int]] = []
    sampling = SamplingConfig(temperature=1.0, max_tokens=40, seed=3)
    response, _ = asyncio.run(engine.complete_ids([5, 6, 7], sampling, on_token=lambda p, t: heard.append((p, t))))
    assert heard == list(enumerate(response.completion_token_ids))
    plain, _ = asyncio.run(engine.complete_ids([5, 6, 7], sampling))
    assert plain.completion_token_ids == response.completion_token_ids  # listening changes nothing


@pytest.mark.parametrize("lean", [True, False])
def test_both_paths_tell_each_rows_sink_its_own_tokens(engine: TransformersChatClient, lean: bool) -> None:
    base = engine._generator
    gen = BatchGenerator(engine.model, engine.tokenizer, base.eos_ids, base.pad_id, engine.device, lean=lean)
    assert (gen.lean is not None) == lean  # the tiny Qwen2 model decodes on the lean path unless told not to
    heard: dict[int, list[int]] = {0: [], 2: []}
    rows = [
        RowRequest([5, 6, 7], SamplingConfig(temperature=1.0, max_tokens=30, seed=1), on_token=lambda p, t: heard[0].append(t)),
        RowRequest([9, 9], SamplingConfig(temperature=1.0, max_tokens=12, seed=2)),  # no sink
        RowRequest([5, 6, 7], SamplingConfig(temperature=1.0, max_tokens=20, seed=4), on_token=lambda p, t: heard[2].append(t)),
    ]  # fmt: skip
    results = gen.generate(rows)
    assert heard[0] == results[0].completion_ids and heard[2] == results[2].completion_ids


def test_a_sink_that_raises_is_dropped_and_the_row_still_completes(engine: TransformersChatClient) -> None:
    calls = []

    def broken(position: int, token: int) -> None:
        calls.append(position)
        raise RuntimeError("the client went away")

    response, _ = asyncio.run(engine.complete_ids([5, 6], SamplingConfig(max_tokens=10, seed=0), on_token=broken))
    assert calls == [0] and response.completion_token_ids
