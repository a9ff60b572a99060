"""SFT demonstrations that carry tools and tool calls: the warm start sees the prompts a tool-using agent sends.

The items' prompt ids are compared with the ``prompt_token_ids`` Ludic's server returns for the same chat and
``tools=`` (what an OpenAI-SDK program's calls are recorded and trained with).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ludic.cli.demonstrations import demonstration_items, read_demonstrations
from ludic.config import parse_config
from ludic.envs.demonstrations import Demonstration

CALCULATOR = {
    "type": "function",
    "function": {"name": "calculator", "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}}},
}
QUESTION = [{"role": "user", "content": "What is 6*7?"}]
CALL_TEXT = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
CALL_MESSAGE = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": {"expression": "6*7"}}}]}  # fmt: skip
AFTER_CALL = [*QUESTION, CALL_MESSAGE, {"role": "tool", "tool_call_id": "c1", "content": "42"}]


def server_prompt_ids(base_url: str, messages: list[dict], tools: list[dict]) -> list[int]:
    body = {"model": "tiny", "messages": messages, "tools": tools, "max_tokens": 1, "temperature": 0}
    response = httpx.post(base_url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()["prompt_token_ids"]


def test_demonstrations_with_tools_are_tokenised_as_the_agent_sends_them(
    tmp_path: Path, model_dir: Path, base_url: str
) -> None:
    demos = tmp_path / "demos.jsonl"
    lines = [
        {"prompt": QUESTION, "answer": CALL_TEXT, "tools": [CALCULATOR]},  # the call, in the model's format
        {"messages": [*AFTER_CALL, {"role": "assistant", "content": "The answer is 42."}], "tools": [CALCULATOR]},
    ]
    demos.write_text("".join(json.dumps(line) + "\n" for line in lines))
    read = read_demonstrations(demos)
    assert [d.tools for d in read] == [[CALCULATOR], [CALCULATOR]]
    cfg = parse_config({"model": {"path": str(model_dir)}, "env": {"name": "letter_repeat"},
                        "sft": {"steps": 1, "batch_size": 2, "demonstrations": str(demos)}})  # fmt: skip
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    call_item, answer_item = demonstration_items(cfg, tokenizer)
    for item, messages in [(call_item, QUESTION), (answer_item, AFTER_CALL)]:
        prompt = item.input_ids[: item.meta["prompt_length"]]
        assert prompt == server_prompt_ids(base_url, messages, [CALCULATOR])  # the tools block included
        assert '"name": "calculator"' in tokenizer.decode(prompt)
    trained = [t for t, m in zip(call_item.input_ids, call_item.action_mask, strict=True) if m]
    assert tokenizer.decode(trained) == CALL_TEXT + "<|im_end|>"  # the call is what the warm start teaches


def test_bad_tools_and_structured_answers_are_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"Demonstration\.tools must be a list of tool schemas"):
        Demonstration("hi", "there", tools="calculator")  # type: ignore[arg-type]
    demos = tmp_path / "demos.jsonl"
    demos.write_text(json.dumps({"messages": [*QUESTION, CALL_MESSAGE], "tools": [CALCULATOR]}) + "\n")
    with pytest.raises(ValueError, match=r"demos.jsonl:1: the answer's tool_calls: write the call as the answer's"):
        read_demonstrations(demos)
