"""Tutorial 1: a single-turn env of your own, trained with an SFT warm start and GRPO (docs/tutorial.md).

    .venv/bin/python examples/tutorial/single_turn.py            # ~1-2 min on 2 CPU cores
    .venv/bin/python examples/tutorial/single_turn.py --steps 3 --sft-steps 2   # smoke run

The task: "What letter comes after x?" for x in a-h; reward 1 for exactly the next letter, else 0.
"""

from __future__ import annotations

import asyncio
import random
import string
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (
    flags,
    grpo,
    held_out_evaluator,
    held_out_reward,
    plot,
    print_report,
    tiny_policy,
    warm_start,
)

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.training import RolloutEngine, seeded_episode, sft_items
from ludic.types import StepOutcome

LETTERS = string.ascii_lowercase[:9]  # questions about a-h (answers b-i): small enough for a tiny model


class NextLetterEnv(SingleAgentEnv):
    """One step. Observation: the question; reward 1.0 for the right letter, 0.0 otherwise."""

    def env_reset(self, *, seed: int | None = None):
        self.letter = random.Random(seed).choice(LETTERS[:-1])
        return self.env_current_obs(), {"letter": self.letter}

    def env_step(self, action: str) -> StepOutcome:
        correct = action == LETTERS[LETTERS.index(self.letter) + 1]
        return StepOutcome(
            obs=None, reward=float(correct), truncated=False, terminated=True, info={"correct": correct}
        )

    def env_current_obs(self) -> str:
        return f"What letter comes after {self.letter}?"


def whole_reply(text: str) -> ParseResult:
    """The parser: the stripped reply is the action (no format to check, no format reward)."""
    return ParseResult(action=text.strip(), reward=0.0, obs=None)


def build_engine(client: Any) -> RolloutEngine:
    """``next_letter`` episodes played under the ``agent`` protocol, by a fresh agent per episode (agents keep state)."""

    def protocol() -> SingleAgentProtocol:
        return SingleAgentProtocol(
            agent=Agent(client=client, model="policy", ctx=FullDialog(), parser=whole_reply)
        )

    return RolloutEngine(env_registry={"next_letter": NextLetterEnv}, protocol_registry={"agent": protocol})


def demonstrations(seed: int, n: int = 320) -> list[tuple[str, str]]:
    """``n`` (question, right letter) pairs for the SFT warm start, questions drawn by ``seed``."""
    rng = random.Random(seed)
    letters = [rng.choice(LETTERS[:-1]) for _ in range(n)]
    return [(f"What letter comes after {c}?", LETTERS[LETTERS.index(c) + 1]) for c in letters]


async def main(steps: int, sft_steps: int, seed: int, out: Path, eval_episodes: int = 64) -> dict[str, float]:
    model, tokenizer, client = tiny_policy(out, seed)
    engine = build_engine(client)
    sampling = SamplingConfig(temperature=1.0, max_tokens=4)
    episode = seeded_episode("next_letter", "agent", sampling=sampling)  # episode(seed) -> a RolloutRequest

    # held-out episodes (seeds never trained on), sampled at temperature 1: the policy's expected reward
    evaluator = held_out_evaluator(engine, episode, eval_episodes)
    report = {"initial": await held_out_reward(evaluator)}

    # 1. SFT warm start: a few demonstrations so GRPO groups are not all-zero (no signal)
    await warm_start(
        model, client, sft_items(tokenizer, demonstrations(seed)), steps=sft_steps, lr=1e-3, seed=seed
    )
    report["start_of_rl"] = await held_out_reward(evaluator)

    # 2. GRPO: 4 prompts per step, each played by a group of 8 (the batch source forms the groups)
    history = await grpo(
        model,
        client,
        engine,
        episode,
        steps=steps,
        seed=seed,
        log_path=out / "metrics.jsonl",
        prefix="[single_turn]",
    )
    report["end"] = await held_out_reward(evaluator)
    plot(history, out / "training_curve.png", "next letter: GRPO after SFT warm start")
    return report


if __name__ == "__main__":
    p = flags(__doc__, steps=150, output_dir="runs/tutorial/single_turn")
    a = p.parse_args()
    print_report(asyncio.run(main(a.steps, a.sft_steps, a.seed, a.output_dir)), "[single_turn]", a.output_dir)
