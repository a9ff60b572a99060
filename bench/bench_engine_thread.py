"""GRPO step time with the embedded engine decoding on a worker thread vs on the event loop's thread.

    OMP_NUM_THREADS=2 .venv/bin/python bench/bench_engine_thread.py --rounds 3 --steps 10

Same tiny model, task and seeds for both settings; rounds interleave them (False, True, False, ...)
and the medians of the per-round mean s/step are compared. Figure for the
``TransformersChatClient(generate_in_thread=...)`` docstring.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time

from transformers import AutoModelForCausalLM

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.distributed import ClientPublisher
from ludic.envs import SingleAgentEnv
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing import build_tiny_model
from ludic.training import (
    RolloutEngine,
    SeededRequests,
    TrainerConfig,
    make_grpo,
    online_trainer,
    seeded_episode,
)
from ludic.types import StepOutcome


class SayLetter(SingleAgentEnv):
    def env_reset(self, *, seed: int | None = None):
        self.letter = random.Random(seed).choice("abcd")
        return self.env_current_obs(), {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(None, float(action.strip() == self.letter), False, True, {})

    def env_current_obs(self) -> str:
        return f"Say {self.letter}"


async def seconds_per_step(model_dir: str, in_thread: bool, steps: int) -> float:
    client = TransformersChatClient(model_dir, generate_in_thread=in_thread)
    model = AutoModelForCausalLM.from_pretrained(model_dir)

    def protocol() -> SingleAgentProtocol:
        return SingleAgentProtocol(
            agent=Agent(client=client, model="m", ctx=FullDialog(), parser=ParseResult)
        )

    engine = RolloutEngine(env_registry={"say": SayLetter}, protocol_registry={"one": protocol})
    say = seeded_episode(
        "say", "one", sampling=SamplingConfig(temperature=1.0, max_tokens=16), seed_sampling=False
    )
    trainer = online_trainer(
        model, engine=engine, algo=make_grpo(group_size=8), request_fn=SeededRequests(say, per_step=4),
        concurrency=32, publisher=ClientPublisher(client),
        cfg=TrainerConfig(lr=1e-3, max_seq_len=256, micro_token_budget=4096, seed=0),
    )  # fmt: skip
    await trainer.train(2)  # warm-up
    t0 = time.perf_counter()
    await trainer.train(steps)
    return (time.perf_counter() - t0) / steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    args = p.parse_args()
    model_dir = str(build_tiny_model(tempfile.mkdtemp(prefix="bench-thread-"), seed=0))
    times: dict[bool, list[float]] = {False: [], True: []}
    for r in range(args.rounds):
        for in_thread in (False, True) if r % 2 == 0 else (True, False):
            times[in_thread].append(asyncio.run(seconds_per_step(model_dir, in_thread, args.steps)))
            print(f"round {r} generate_in_thread={in_thread}: {times[in_thread][-1]:.4f} s/step", flush=True)
    loop, thread = statistics.median(times[False]), statistics.median(times[True])
    print(
        f"median s/step: loop thread {loop:.4f}, worker thread {thread:.4f}: worker/loop = {thread / loop:.2f}x"
    )


if __name__ == "__main__":
    main()
