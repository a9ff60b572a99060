"""No deprecation warnings from our own calls under the installed transformers: an engine generation (the
lean decoder and the model's own forward) and a train step, with DeprecationWarning/FutureWarning raised
from Ludic's frames as errors and transformers' logged deprecations (``past_key_values`` is deprecated, said
through its logger, once per process) counted."""

from __future__ import annotations

import asyncio
import logging
import warnings
from collections.abc import Iterator

import pytest
from transformers import AutoModelForCausalLM
from transformers.utils import logging as hf_logging

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.inference.embedded._generation import BatchGenerator
from ludic.testing import tiny_model_path
from ludic.training.config import TrainerConfig
from ludic.training.trainer import Trainer

from ...training.test_trainer import ITEMS, FixedBatchSource, reinforce


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture
def deprecations() -> Iterator[list[str]]:
    """Logged transformers deprecations seen meanwhile; Python deprecations from ludic frames raise."""
    logging.Logger.warning_once.cache_clear()  # type: ignore[attr-defined]  # said once per process: say it again
    handler = _Records()
    logger = hf_logging.get_logger("transformers")
    logger.addHandler(handler)
    with warnings.catch_warnings():
        for category in (DeprecationWarning, FutureWarning):
            warnings.filterwarnings("error", category=category, module=r"ludic(\.|$)")
        try:
            yield handler.messages
        finally:
            logger.removeHandler(handler)


def _generate(client: TransformersChatClient) -> None:
    async def go() -> None:
        requests = [ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": f"q{i}"}],
                                          sampling=SamplingConfig(temperature=1.0, max_tokens=6, seed=i)) for i in range(3)]  # fmt: skip
        await asyncio.gather(*[client.complete(r) for r in requests])

    asyncio.run(go())


@pytest.mark.parametrize("lean", [True, False])
def test_an_engine_generation_warns_of_no_deprecation(deprecations, lean) -> None:
    client = TransformersChatClient(str(tiny_model_path()))
    gen = client._generator
    client._generator = BatchGenerator(client.model, gen.tokenizer, gen.eos_ids, gen.pad_id, gen.device, lean=lean)
    _generate(client)
    assert client._generator.forward_calls > 0  # the model's own forward ran (the lean decoder's prefill too)
    assert not [m for m in deprecations if "deprecat" in m.lower()], deprecations


def test_a_train_step_warns_of_no_deprecation(deprecations) -> None:
    trainer = Trainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_path()), algo=reinforce(),
                      batch_source=FixedBatchSource(ITEMS), cfg=TrainerConfig(lr=1e-3, max_seq_len=32))  # fmt: skip
    trainer.train_step_sync()
    assert not [m for m in deprecations if "deprecat" in m.lower()], deprecations
