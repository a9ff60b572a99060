"""A verifiers (0.4) task with an MCP tool round-trips the tool on Ludic's server: call -> tool result -> answer.

verifiers' own harness program (in its subprocess runtime) talks to Ludic's server with the task's MCP tool
(``tests/envs/vf_tasks/vf_tools.py``, an ``add`` tool); the served model is the tiny model fitted to call the
tool and then to answer with the result, so the reward is 1 only if the call came back as ``tool_calls``, the
harness ran the real MCP tool and its result reached the model.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from tests.inference.server.test_tool_calls_openai import fit_texts

from ludic.envs.verifiers_env import VerifiersEnv
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.interaction.verifiers_episode import VerifiersEpisodeProtocol
from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # verifiers' subprocess runtime and an MCP server

TASKS = Path(__file__).parents[2] / "envs" / "vf_tasks"
ADD_TOOL = {  # the schema verifiers 0.4 offers for vf_tools' AddTools.add (its MCP tool)
    "type": "function",
    "function": {
        "name": "add_tools_add",
        "description": "Add two integers.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"title": "A", "type": "integer"}, "b": {"title": "B", "type": "integer"}},
            "required": ["a", "b"],
            "title": "addArguments",
        },
    },
}
QUESTION = [{"role": "user", "content": "What is 2+3? Use the add tool."}]
CALL_TEXT = '<tool_call>{"name": "add_tools_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
ANSWER = "The sum is 5."


@pytest.fixture(scope="module")
def tool_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    small = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128}
    model_dir = build_tiny_model(tmp_path_factory.mktemp("vf-tool-model"), seed=0, **small)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ask = tokenizer.apply_chat_template(QUESTION, tools=[ADD_TOOL], add_generation_prompt=True, tokenize=False)
    # the tool's result as the chat continues after the call's exact ids: "<|im_start|>tool\n5<|im_end|>"
    after = f"{ask}{CALL_TEXT}<|im_end|>\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    fit_texts(model_dir, [(ask, CALL_TEXT), (after, ANSWER)])
    with running_server(model_dir) as url:
        yield url + "/v1"


def test_a_verifiers_task_with_an_mcp_tool_round_trips_the_tool(
    tool_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(TASKS))
    monkeypatch.setenv("PYTHONPATH", str(TASKS))  # verifiers starts the tool server as `python -m vf_tools`
    agent = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}
    env = VerifiersEnv(env_config={"taskset": {"id": "vf_tools"}, "agent": agent})
    protocol = VerifiersEpisodeProtocol(base_url=tool_url, harness_python=sys.executable)
    inference = InferenceSpec(sampling=SamplingConfig(temperature=0.0, max_tokens=120))
    (rollout,) = asyncio.run(protocol.run(env=env, max_steps=4, env_seed=1, sampling_seed=0, inference=inference))
    call, answer = rollout.steps
    assert bytes(t - 3 for t in call.trace.completion_token_ids[:-1]).decode() == CALL_TEXT  # byte b is id b + 3
    head = [*call.trace.prompt_token_ids, *call.trace.completion_token_ids]
    assert answer.trace.prompt_token_ids[: len(head)] == head and "sequence_break" not in answer.info
    tool_turn = bytes(t - 3 for t in answer.trace.prompt_token_ids[len(head) :] if t >= 3).decode()
    assert "tool\n5" in tool_turn  # the real MCP tool ran on the parsed arguments: add(2, 3)
    assert bytes(t - 3 for t in answer.trace.completion_token_ids[:-1]).decode() == ANSWER
    assert answer.info["vf_rewards"] == {"correct": 1.0} and answer.reward == 1.0
