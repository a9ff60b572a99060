"""The smallest complete Ludic training loop: env, agent, engine, GRPO, Trainer, weight sync.

Run: ``.venv/bin/python examples/minimal_grpo.py`` (a few seconds on a CPU; builds a tiny model).
The task: reply with the letter the prompt names; reward 1 for an exact match.

A wiring demo: it runs 5 GRPO steps on an untrained ~0.8M-parameter model, which does not learn
the task in that time (a from-scratch model rarely says the right letter, so most groups tie).
It prints one short line per step (step, reward, loss, seconds), writes every stat to
``runs/minimal_grpo/metrics.jsonl`` and ends with the training reward of the first and last step.
For runs that learn on a CPU see ``docs/tutorial.md`` (SFT warm start, then GRPO) and the quickstart.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path

from transformers import AutoModelForCausalLM

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.distributed import ClientPublisher
from ludic.envs import SingleAgentEnv
from ludic.inference import InferenceSpec, SamplingConfig, TransformersChatClient
from ludic.interaction import SingleAgentSyncProtocol
from ludic.parsers import ParseResult
from ludic.testing import build_tiny_model
from ludic.training import (
    EnvSpec,
    ProtocolSpec,
    RolloutBatchSource,
    RolloutEngine,
    RolloutRequest,
    Trainer,
    TrainerConfig,
    make_grpo,
)
from ludic.training.loggers import ProgressLogger, before_after, progress_and_metrics
from ludic.types import StepOutcome


class SayLetterEnv(SingleAgentEnv):
    """One step: the prompt names a letter; reward 1 if the reply is exactly that letter."""

    def env_reset(self, *, seed: int | None = None):
        self.letter = random.Random(seed).choice("abcd")
        return self.env_current_obs(), {"letter": self.letter}

    def env_step(self, action: str) -> StepOutcome:
        hit = action.strip() == self.letter
        return StepOutcome(None, float(hit), False, True, {"hit": hit})

    def env_current_obs(self) -> str:
        return f"Say {self.letter}"


def grpo_trainer(model, client, *, max_tokens: int = 4, seed: int | None = None, train_logger=None) -> Trainer:
    """The whole stack, wired by hand: registries -> engine -> GRPO batch source -> Trainer (+ weight sync)."""

    def protocol() -> SingleAgentSyncProtocol:  # fresh agent per episode: agents are stateful
        agent = Agent(client=client, model="tiny", ctx=FullDialog(), parser=lambda t: ParseResult(t))
        return SingleAgentSyncProtocol(agent=agent)

    engine = RolloutEngine(env_registry={"say": SayLetterEnv}, protocol_registry={"single": protocol})
    algo = make_grpo(group_size=8)  # the one place for the group size: the batch source forms the groups
    seeds = iter(range(10**9))
    sampling = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens))
    batch_source = RolloutBatchSource(
        engine=engine,
        request_fn=lambda: [
            RolloutRequest(EnvSpec("say"), ProtocolSpec("single"), env_seed=next(seeds), inference=sampling)
            for _ in range(4)
        ],
        algorithm=algo,
        max_steps=1,
        concurrency=32,
    )
    return Trainer(
        model=model,
        algo=algo,
        batch_source=batch_source,
        publisher=ClientPublisher(client),  # push weights to the engine every step
        cfg=TrainerConfig(lr=1e-3, max_seq_len=256, micro_token_budget=4096, seed=seed),  # pads with the model's pad id
        train_logger=train_logger,
    )


async def main(steps: int = 5, metrics_path: Path | None = None) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="ludic-minimal-grpo-") as tmp:  # removed once loaded
        model_dir = build_tiny_model(tmp)
        client = TransformersChatClient(model_dir)  # the embedded inference engine
        model = AutoModelForCausalLM.from_pretrained(model_dir)  # the trainer's copy

    logger = (  # one short line per step on screen; every stat in the metrics file
        progress_and_metrics(metrics_path, "[minimal_grpo]", total_steps=steps)
        if metrics_path else ProgressLogger("[minimal_grpo]", total_steps=steps)
    )  # fmt: skip
    history = await grpo_trainer(model, client, train_logger=logger).train(num_steps=steps)  # a stats dict per step
    first, last = (h["train/avg_total_reward"] for h in (history[0], history[-1]))
    print(before_after(f"train reward, step 1 -> step {steps}:", first, last, prefix="[minimal_grpo]"))
    return history[-1]


if __name__ == "__main__":
    asyncio.run(main(metrics_path=Path("runs/minimal_grpo/metrics.jsonl")))
