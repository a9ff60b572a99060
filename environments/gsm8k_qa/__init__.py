"""GSM8K-style QA package: a tiny local dataset, the env factory, a harness and an oracle."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import DatasetQAEnv, gsm8k_target_parser
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.parsers import boxed_parser
from ludic.testing.scripted_client import ScriptedChatClient

DATA = Path(__file__).parent / "data" / "problems.jsonl"
SYSTEM_PROMPT = "Solve the problem step by step, then give the final number as \\boxed{N}."


def load_problems(path: str | Path = DATA) -> list[dict[str, str]]:
    """Rows with ``question`` and ``answer`` ("... #### N"), as in GSM8K's JSONL."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def make_env(index: int = 0, path: str | Path = DATA) -> DatasetQAEnv:
    """The env for problem ``index`` (wrapping around the dataset)."""
    problems = load_problems(path)
    return DatasetQAEnv(problems[index % len(problems)], gsm8k_target_parser, system_prompt=SYSTEM_PROMPT)


def make_agent(
    client: Any, *, model: str = "policy", tokenizer: Any = None, sampling: SamplingConfig | None = None
) -> Agent:
    """Full-dialog agent whose action is the last ``\\boxed{...}``; a missing box costs -1."""
    return Agent(
        client=client,
        model=model,
        ctx=FullDialog(),
        parser=boxed_parser(),
        tokenizer=tokenizer,
        sampling=sampling,
    )


def oracle_client(path: str | Path = DATA) -> ScriptedChatClient:
    """A scripted 'model' that looks the question up and answers correctly (for demos and tests)."""
    answers = {p["question"]: gsm8k_target_parser(p["answer"]) for p in load_problems(path)}

    def reply(request: ChatCompletionRequest) -> str:
        question = next(m["content"] for m in request.messages if m["role"] == "user")
        return f"The answer is \\boxed{{{answers[question]}}}."

    return ScriptedChatClient(reply)
