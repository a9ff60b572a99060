"""RolloutEngine speed, side by side in one run.

1. Framework overhead: a client that answers instantly, a one-step env, many episodes: episodes/s
   and microseconds of framework time per agent step (everything but inference).
2. Concurrency: a client that answers after a fixed latency (50 ms): episodes/s at concurrency
   1, 8, 32, 128 against the ideal ``concurrency / latency`` (goal: >= 90% of ideal at 32).

Run: ``.venv/bin/python bench/bench_rollouts.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference.request import ChatCompletionRequest
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.training.batching import RolloutEngine
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest
from ludic.types import ChatResponse, StepOutcome


class CountdownEnv(SingleAgentEnv):
    """``steps`` turns; reward 1 on the last."""

    def __init__(self, steps: int = 1) -> None:
        self.steps = steps

    def env_reset(self, *, seed: int | None = None):
        self.left = self.steps
        return self.env_current_obs(), {}

    def env_step(self, action: str) -> StepOutcome:
        self.left -= 1
        done = self.left == 0
        return StepOutcome(None if done else self.env_current_obs(), float(done), False, done, {})

    def env_current_obs(self) -> str:
        return f"{self.left} to go"


class FixedLatencyClient:
    """Stands in for an inference server that answers after ``latency_s`` (0: at once)."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        prompt = request.prompt_token_ids or [1, 2, 3]
        return ChatResponse("ok", "stop", list(prompt), [7, 8], [-0.1, -0.2], 0), {}

    def sync_weights(self, params, *, timeout_s: float = 600.0, version: int | None = None) -> str:
        return "ok"


def make_engine(latency_s: float, env_steps: int) -> RolloutEngine:
    client = FixedLatencyClient(latency_s)

    def protocol() -> SingleAgentProtocol:
        agent = Agent(client=client, model="m", ctx=FullDialog(), parser=lambda t: ParseResult(t))
        return SingleAgentProtocol(agent=agent)

    return RolloutEngine(
        env_registry={"countdown": lambda: CountdownEnv(env_steps)}, protocol_registry={"single": protocol}
    )


async def episodes_per_second(engine: RolloutEngine, episodes: int, concurrency: int) -> float:
    requests = [
        RolloutRequest(EnvSpec("countdown"), ProtocolSpec("single"), env_seed=i) for i in range(episodes)
    ]
    start = time.perf_counter()
    rollouts = await engine.generate_rollouts(requests=requests, max_steps=64, concurrency=concurrency)
    assert len(rollouts) == episodes
    return episodes / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--env-steps", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    args = parser.parse_args()

    instant = make_engine(0.0, args.env_steps)
    asyncio.run(episodes_per_second(instant, 100, 32))  # warm-up
    rate = asyncio.run(episodes_per_second(instant, args.episodes, 32))
    per_step_us = 1e6 / (rate * args.env_steps)
    print(
        f"framework overhead: {rate:,.0f} episodes/s with an instant client "
        f"({args.env_steps} agent steps each): {per_step_us:,.0f} us per agent step"
    )

    latency = args.latency_ms / 1000
    slow = make_engine(latency, 1)
    print(f"\nfixed {args.latency_ms:.0f} ms client, one-step episodes")
    print(f"{'concurrency':>12}{'episodes/s':>14}{'ideal':>10}{'of ideal':>10}")
    for concurrency in (1, 8, 32, 128):
        episodes = max(concurrency * 6, 12)
        measured = asyncio.run(episodes_per_second(slow, episodes, concurrency))
        ideal = concurrency / latency
        print(f"{concurrency:>12}{measured:>14,.1f}{ideal:>10,.0f}{measured / ideal:>10.1%}")


if __name__ == "__main__":
    main()
