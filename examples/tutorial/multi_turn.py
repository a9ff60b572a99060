"""Tutorial 2: a multi-turn env; the agent keeps the dialog (docs/tutorial.md).

    .venv/bin/python examples/tutorial/multi_turn.py             # a few minutes on 2 CPU cores
    .venv/bin/python examples/tutorial/multi_turn.py --steps 3 --sft-steps 2    # smoke run

The task: count down. "Count down from 5." -> "4", "3", "2", "1", one number per turn. Each
correct number earns 1/n, so a perfect episode scores 1.0; a wrong number ends the episode.
The env's reply to a correct number is just "Next.", so the agent has to read its own last reply:
the whole dialog (FullDialog) is the state.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import flags, grpo, held_out, held_out_evaluator, plot, print_report, tiny_policy, warm_start

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.training import RolloutEngine, seeded_episode, sft_items
from ludic.types import StepOutcome


class CountDownEnv(SingleAgentEnv):
    """Turn k expects ``start - k``; reward 1/(start - 1) per correct number, episode ends at 1."""

    def env_reset(self, *, seed: int | None = None):
        self.start = random.Random(seed).randint(3, 6)
        self.expected = self.start - 1
        return self.env_current_obs(), {"start": self.start}

    def env_step(self, action: str) -> StepOutcome:
        if action != str(self.expected):
            return StepOutcome(None, 0.0, False, True, {"correct": False})
        self.expected -= 1
        done = self.expected == 0
        return StepOutcome(None if done else "Next.", 1.0 / (self.start - 1), False, done, {"correct": True})

    def env_current_obs(self) -> str:
        return f"Count down from {self.start}, one number per reply."


def demonstration(start: int) -> list[tuple[list[dict[str, str]], str]]:
    """(dialog so far, right reply) for every turn of a perfect episode: SFT pairs with message-list prompts."""
    dialog = [{"role": "user", "content": f"Count down from {start}, one number per reply."}]
    pairs = []
    for n in range(start - 1, 0, -1):
        pairs.append((list(dialog), str(n)))
        dialog += [{"role": "assistant", "content": str(n)}, {"role": "user", "content": "Next."}]
    return pairs


async def main(
    steps: int, sft_steps: int, seed: int, out: Path, eval_episodes: int = 128
) -> dict[str, dict[str, float]]:
    """Held-out reward (mean, 95% interval, n) before training, after the warm start and after GRPO."""
    model, tokenizer, client = tiny_policy(out, seed)
    parser = lambda text: ParseResult(action=text.strip(), reward=0.0, obs=None)  # noqa: E731

    def protocol() -> SingleAgentProtocol:
        return SingleAgentProtocol(
            agent=Agent(client=client, model="policy", ctx=FullDialog(), parser=parser)
        )

    engine = RolloutEngine(env_registry={"countdown": CountDownEnv}, protocol_registry={"agent": protocol})
    sampling = SamplingConfig(temperature=1.0, max_tokens=4)
    episode = seeded_episode("countdown", "agent", sampling=sampling)  # episode(seed) -> a RolloutRequest
    evaluator = held_out_evaluator(engine, episode, eval_episodes, max_turns=6)
    report = {"initial": await held_out(evaluator)}
    rng = random.Random(seed)
    demos = [pair for _ in range(80) for pair in demonstration(rng.randint(3, 6))]
    await warm_start(model, client, sft_items(tokenizer, demos), steps=sft_steps, lr=1e-3, seed=seed)
    report["start_of_rl"] = await held_out(evaluator)
    history = await grpo(
        model, client, engine, episode, steps=steps, seed=seed, max_turns=6, log_path=out / "metrics.jsonl",
        prefix="[multi_turn]",
    )  # fmt: skip
    report["end"] = await held_out(evaluator)
    plot(history, out / "training_curve.png", "count down: GRPO after SFT warm start")
    return report


if __name__ == "__main__":
    p = flags(__doc__, steps=100, output_dir="runs/tutorial/multi_turn")
    a = p.parse_args()
    print_report(asyncio.run(main(a.steps, a.sft_steps, a.seed, a.output_dir)), "[multi_turn]", a.output_dir)
