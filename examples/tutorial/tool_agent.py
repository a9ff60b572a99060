"""Tutorial 3: an agent that calls a Python tool before answering (docs/tutorial.md).

    .venv/bin/python examples/tutorial/tool_agent.py --steps 3    # wiring demo, seconds on a CPU
    .venv/bin/python examples/tutorial/tool_agent.py --model Qwen/Qwen2.5-0.5B-Instruct --steps 100

A wiring demo on the tiny model: a ~0.8M-parameter model never learns to write a JSON tool call
in a few minutes, so with the default tiny model the reward stays near 0. It shows how a tool
(``add``) is declared, called, recorded and trained (every model call of a turn, the tool-call
replies included, is trained with the turn's credit). Run it with ``--model`` on a real
instruction-tuned model to see learning.

The task: "What is 23 + 19?"; reward 1 for the exact sum. The agent may call ``add(a, b)``.
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import flags, grpo, held_out_evaluator, held_out_reward, plot, print_report, tiny_policy

from ludic.agents import ToolAgent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.training import RolloutEngine, seeded_episode
from ludic.types import StepOutcome


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first number.
        b: the second number.
    """
    return a + b


class SumEnv(SingleAgentEnv):
    def env_reset(self, *, seed: int | None = None):
        rng = random.Random(seed)
        self.a, self.b = rng.randint(10, 49), rng.randint(10, 49)
        return self.env_current_obs(), {}

    def env_step(self, action: str) -> StepOutcome:
        correct = action == str(self.a + self.b)
        return StepOutcome(None, float(correct), False, True, {"correct": correct})

    def env_current_obs(self) -> str:
        return f"What is {self.a} + {self.b}? Reply with the number only."


async def main(
    steps: int, seed: int, out: Path, model_name: str | None, eval_episodes: int = 64
) -> dict[str, float]:
    if model_name is None:
        model, _, client = tiny_policy(out, seed)
    else:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_name)
        client = TransformersChatClient(model_name, model_name="policy")
    parser = lambda text: ParseResult(action=text.strip(), reward=0.0, obs=None)  # noqa: E731

    def protocol() -> SingleAgentProtocol:
        agent = ToolAgent(
            tools=[add], max_tool_rounds=1, client=client, model="policy", ctx=FullDialog(), parser=parser
        )
        return SingleAgentProtocol(agent=agent)

    engine = RolloutEngine(env_registry={"sum": SumEnv}, protocol_registry={"agent": protocol})
    sampling = SamplingConfig(temperature=1.0, max_tokens=48)
    episode = seeded_episode("sum", "agent", sampling=sampling)  # episode(seed) -> a RolloutRequest
    evaluator = held_out_evaluator(engine, episode, eval_episodes, concurrency=32)
    report = {"start_of_rl": await held_out_reward(evaluator)}
    history = await grpo(
        model, client, engine, episode, steps=steps, seed=seed, prompts_per_step=2, log_path=out / "metrics.jsonl",
        prefix="[tool_agent]",
    )  # fmt: skip
    report["end"] = await held_out_reward(evaluator)
    report["tool_calls_in_last_eval"] = float(
        sum(len(s.info.get("tool_calls") or []) for r in evaluator.last_rollouts for s in r.steps)
    )
    plot(history, out / "training_curve.png", "sum with an add tool: GRPO")
    return report


if __name__ == "__main__":
    p = flags(__doc__, steps=3, sft_steps=None, output_dir="runs/tutorial/tool_agent")
    p.add_argument("--model", default=None, help="a real instruction-tuned model (default: the tiny model)")
    a = p.parse_args()
    print_report(asyncio.run(main(a.steps, a.seed, a.output_dir, a.model)), "[tool_agent]", a.output_dir)
