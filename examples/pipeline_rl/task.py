"""The job both sides of the pipeline example share: the quickstart's letter task on any ChatClient.

``make_client`` gives an HTTP client for a running Ludic (or vLLM) server, or an embedded engine in
this process; ``rollout_source`` plays GRPO groups on it and assigns credit (what an actor pushes).
"""

from __future__ import annotations

import itertools
from typing import Any

from ludic.envs.letter_repeat import LetterRepeatEnv
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.registry.builtins import plain_harness, single_agent_protocol
from ludic.training import EnvSpec, ProtocolSpec, RolloutBatchSource, RolloutEngine, RolloutRequest
from ludic.training.batching import GRPORequestStrategy
from ludic.training.presets import make_grpo

LETTERS = "abcdefgh"


def make_client(*, server_url: str | None, model_dir: str | None, weight_updates: bool = False) -> Any:
    """``VLLMChatClient`` for ``server_url``, else an embedded ``TransformersChatClient`` on ``model_dir``."""
    if server_url:
        from transformers import AutoTokenizer

        from ludic.inference import VLLMChatClient

        client = VLLMChatClient(base_url=server_url, enable_weight_updates=weight_updates)
        client.tokenizer = AutoTokenizer.from_pretrained(model_dir) if model_dir else None
        return client
    if not model_dir:
        raise SystemExit("pass --server-url (a running `python -m ludic.inference.server`) or --model-dir")
    from ludic.inference import TransformersChatClient

    return TransformersChatClient(model_dir, model_name="pipeline")


def rollout_source(
    client: Any, *, prompts: int, group_size: int, seed: int, max_tokens: int = 16
) -> RolloutBatchSource:
    """Fresh training seeds every batch (``seed`` picks a disjoint range per actor)."""
    sampling = SamplingConfig(temperature=1.0, max_tokens=max_tokens)

    def protocol(**kwargs: Any) -> Any:  # fresh agent per episode: agents are stateful
        agent = plain_harness(
            client=client, model="pipeline", tokenizer=client.tokenizer, sampling=sampling,
            incomplete_reward=0.0,
        )  # fmt: skip
        return single_agent_protocol(agent=agent, **kwargs)

    engine = RolloutEngine(env_registry={"letters": LetterRepeatEnv}, protocol_registry={"single": protocol})
    seeds = itertools.count(seed * 10_000_000)

    def requests() -> list[RolloutRequest]:
        return [
            RolloutRequest(
                EnvSpec("letters", {"letters": LETTERS, "count": 4}), ProtocolSpec("single"),
                env_seed=(s := next(seeds)), sampling_seed=s, inference=InferenceSpec(sampling=sampling),
                meta={"actor_seed": seed},
            )
            for _ in range(prompts)
        ]

    return RolloutBatchSource(
        engine=engine,
        request_fn=requests,
        algorithm=make_grpo(group_size=group_size),
        max_steps=1,
        request_strategy=GRPORequestStrategy(group_size=group_size, seed=seed),  # group ids g{seed}-N
        concurrency=prompts * group_size,
    )
