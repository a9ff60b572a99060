"""GRPO on small programming problems judged in the bubblewrap sandbox.

Each episode: the model sees a problem from ``problems.jsonl`` (shipped beside this file), writes a
Python program, ``CodeExecEnv`` runs it against the problem's tests in the sandbox and rewards the
pass rate. ``all_passed`` / ``compile_failed`` / ``pass_rate`` are reduced into the logged stats.

Run: ``.venv/bin/python examples/code_exec/train_code_exec.py --steps 20`` (tiny model, CPU) or
``--model-dir /path/to/a/code/model`` for a real one. With the ~0.8M-parameter tiny model built
offline, every reply is cut off at the token limit or fails to compile, every group ties and GRPO has
no signal: on a CPU this is a smoke test of the loop (sandbox in the loop, reducers, weight sync), not a demonstration of
learning. A model that can already write some Python is needed for the pass rate to move.
It prints one short line per step (reward, pass rate, loss, seconds), writes every stat to
``--output-dir``/metrics.jsonl and ends with the training pass rate of the first and last step.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from transformers import AutoModelForCausalLM

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.distributed import ClientPublisher
from ludic.envs.code_exec import CodeExecEnv, SandboxLimits, shared_executor
from ludic.inference import InferenceSpec, SamplingConfig, TransformersChatClient
from ludic.interaction import SingleAgentSyncProtocol
from ludic.parsers import ParseResult
from ludic.testing import build_tiny_model
from ludic.training import (
    EnvSpec,
    ProtocolSpec,
    RolloutEngine,
    RolloutRequest,
    TrainerConfig,
    make_grpo,
    online_trainer,
)
from ludic.training.loggers import ProgressLogger, before_after, progress_and_metrics
from ludic.training.stats import Reducer, default_reducers

PROBLEMS = Path(__file__).with_name("problems.jsonl")
REDUCERS = {
    **default_reducers(),
    "all_passed_rate": Reducer(
        kind="count_true", source="all_passed", normalize_by="rollouts", as_percent=True
    ),
    "compile_fail_rate": Reducer(
        kind="count_true", source="compile_failed", normalize_by="rollouts", as_percent=True
    ),
    "avg_pass_rate": Reducer(kind="mean", source="pass_rate"),
}


def load_problems(path: Path = PROBLEMS) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def main(
    steps: int = 5,
    *,
    group_size: int = 4,
    prompts_per_step: int = 2,
    max_tokens: int = 64,
    model_dir: str | None = None,
    pool_size: int = 4,
    metrics_path: Path | None = None,
) -> dict[str, float]:
    problems = load_problems()
    with tempfile.TemporaryDirectory(prefix="ludic-code-exec-model-") as tmp:  # a built tiny model: removed once loaded
        model_dir = model_dir or str(build_tiny_model(tmp))
        client = TransformersChatClient(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir)
    executor = shared_executor("bubblewrap", limits=SandboxLimits(wall_s=5, cpu_s=2), pool_size=pool_size)

    def env(index: int) -> CodeExecEnv:
        return CodeExecEnv(problems[index], executor=executor)

    def protocol() -> SingleAgentSyncProtocol:
        agent = Agent(client=client, model="policy", ctx=FullDialog(), parser=lambda t: ParseResult(t))
        return SingleAgentSyncProtocol(agent=agent)

    rng = random.Random(0)
    sampling = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens))
    trainer = online_trainer(
        model,
        engine=RolloutEngine(env_registry={"code": env}, protocol_registry={"single": protocol}),
        algo=make_grpo(group_size=group_size),  # the batch source plays each request group_size times
        request_fn=lambda: [
            RolloutRequest(
                EnvSpec("code", {"index": rng.randrange(len(problems))}),
                ProtocolSpec("single"),
                inference=sampling,
            )
            for _ in range(prompts_per_step)
        ],
        concurrency=16,
        publisher=ClientPublisher(client),
        cfg=TrainerConfig(lr=1e-4, max_seq_len=512, micro_token_budget=8192, pad_token_id=0),
        reducers=REDUCERS,
        train_logger=progress_logger(steps, metrics_path),
    )
    history = await trainer.train(num_steps=steps)
    first, last = (h["train/avg_pass_rate"] for h in (history[0], history[-1]))
    print(before_after(f"train pass rate, step 1 -> step {steps}:", first, last, prefix="[code_exec]"))
    return history[-1]  # the last step's stats


def progress_logger(steps: int, metrics_path: Path | None) -> ProgressLogger | Any:
    """One short line per step on screen; every stat in ``metrics_path`` when given."""
    keys = {"reward": "train/avg_total_reward", "pass": "train/avg_pass_rate", "loss": "train/loss"}
    if metrics_path is None:
        return ProgressLogger("[code_exec]", total_steps=steps, keys=keys)
    return progress_and_metrics(metrics_path, "[code_exec]", total_steps=steps, keys=keys)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--output-dir", type=Path, default=Path("runs/code_exec"))
    args = parser.parse_args()
    metrics = args.output_dir / "metrics.jsonl"
    asyncio.run(main(args.steps, group_size=args.group_size, model_dir=args.model_dir, metrics_path=metrics))
    print(f"[code_exec] every stat per step: {metrics}")
