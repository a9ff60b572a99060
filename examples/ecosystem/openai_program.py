"""An agent program written against the OpenAI SDK (a draft, then a revision), played as Ludic episodes.

    python examples/ecosystem/openai_program.py                 # starts Ludic's server on a tiny model
    python examples/ecosystem/openai_program.py --base-url http://127.0.0.1:8000/v1   # a running server

The program is plain OpenAI-SDK code; OpenAIProgramProtocol records each of its calls (exact ids,
log-probs, temperature, policy version) and the rollout engine turns each episode into one exact
training sequence. This script prints one batch; ``openai_program_train.py`` trains the same program
(SFT warm start, GRPO, weights published to the server every step) and reports held-out reward.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile

from ludic.envs.letter_repeat import LetterRepeatEnv
from ludic.interaction.openai_program import OpenAIProgramProtocol, ProgramTask
from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server
from ludic.training.batching.rollout_engine import RolloutEngine
from ludic.training.presets import make_grpo
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest


async def draft_then_revise(client, task: ProgramTask) -> str:
    """Any OpenAI-SDK program: returns an answer the env scores (or a reward as a number)."""
    messages = [{"role": "user", "content": task.prompt}]
    draft = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": draft.choices[0].message.content},
                 {"role": "user", "content": "Check your answer and give it again."}]  # fmt: skip
    final = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=8)
    return final.choices[0].message.content


async def play(base_url: str, group_size: int = 4) -> None:
    engine = RolloutEngine(
        env_registry={"letter_repeat": LetterRepeatEnv},
        protocol_registry={"program": lambda: OpenAIProgramProtocol(draft_then_revise, base_url=base_url)},
        one_sequence=True,  # calls whose prompts extend the previous call's ids train as one sequence
    )
    requests = [RolloutRequest(env=EnvSpec("letter_repeat"), protocol=ProtocolSpec("program"), env_seed=seed,
                               sampling_seed=seed, num_episodes=group_size, meta={"group_id": seed})
                for seed in range(2)]  # fmt: skip
    batch = await engine.generate_batch(requests, make_grpo(group_size=group_size), max_steps=4, timeout_s=120)
    print({k: batch.meta[k] for k in ("effective_rollouts", "failed_rollouts", "num_samples", "avg_total_reward")})
    for item in batch.items:
        print(f"calls={item.meta['num_calls']} tokens={len(item.input_ids)} action tokens={sum(item.action_mask)} "
              f"weight={item.weight:+.2f} reward={item.meta['total_reward']:.2f}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible /v1 root; default: start a tiny model here")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        base_url = args.base_url
        if base_url is None:
            model = build_tiny_model(stack.enter_context(tempfile.TemporaryDirectory()), seed=0)
            base_url = stack.enter_context(running_server(model)) + "/v1"
        asyncio.run(play(base_url))


if __name__ == "__main__":
    main()
