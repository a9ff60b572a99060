"""Tool-call masks on SmolLM2's real BPE tokenizer and template: every model call of a turn trains exactly
the ids it sampled (here split so that re-encoding their text gives other ids); tool results are prompt."""

from __future__ import annotations

import json

from tests.real_tokenizer.ids import EOS, ScriptedIdsClient, split_ids

from ludic.agents import ToolAgent
from ludic.context import FullDialog
from ludic.envs import DatasetQAEnv
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.testing.real_tokenizer import is_canonical
from ludic.training.batching import rollouts_to_saw_items
from ludic.training.batching.sequence_items import rollout_to_sequence_items

CALL = "<tool_call>" + json.dumps({"name": "add", "arguments": {"a": 2, "b": 3}}) + "</tool_call>"


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


async def _play(tokenizer, *, exact: bool):
    replies = [[*split_ids(tokenizer, CALL), EOS], [*split_ids(tokenizer, "<answer>5</answer>"), EOS]]
    assert not any(is_canonical(tokenizer, r) for r in replies)
    client = ScriptedIdsClient(tokenizer, replies)
    agent = ToolAgent(client=client, model="m", ctx=FullDialog(system_prompt="Be exact."), parser=xml_tag_parser("answer"),
                      tools=[add], max_tool_rounds=1, exact_sequence=exact)  # fmt: skip
    (rollout,) = await SingleAgentProtocol(agent).run(env=DatasetQAEnv({"question": "2+3?", "answer": "5"}), max_steps=1)
    return rollout, client, replies


def _masked(item) -> list[int]:
    return [t for t, m in zip(item.input_ids, item.action_mask, strict=True) if m]


async def test_each_call_of_a_tool_turn_trains_exactly_its_sampled_ids(tokenizer):
    rollout, client, replies = await _play(tokenizer, exact=False)
    assert rollout.total_reward == 1.0
    items = rollouts_to_saw_items([rollout], {(rollout.id, 0): 0.5})
    assert len(items) == 2
    for item, request, reply in zip(items, client.requests, replies, strict=True):
        assert item.input_ids == request.prompt_token_ids + reply
        assert item.action_mask == [0] * len(request.prompt_token_ids) + [1] * len(reply)
        assert _masked(item) == reply and item.weight == 0.5
    # SmolLM2's template knows no tools: they are described in the system message; the result is a tool turn
    first, second = (tokenizer.decode(r.prompt_token_ids) for r in client.requests)
    assert first.startswith("<|im_start|>system\nBe exact.\n\nYou can call these tools:\n- add(")
    assert second.endswith("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n")
    # the template renders no tool_calls: the call stays in the reply's content, so the model sees what it called
    assert second.startswith(first + CALL + "<|im_end|>\n<|im_start|>tool\n5")


async def test_with_exact_sequence_the_tool_turn_is_one_sequence_of_the_sampled_ids(tokenizer):
    rollout, client, replies = await _play(tokenizer, exact=True)
    step = rollout.steps[0]
    first, second = client.requests
    head = [*first.prompt_token_ids, *replies[0]]
    assert second.prompt_token_ids[: len(head)] == head, step.info.get("sequence_break")
    assert "sequence_break" not in step.info
    (item,) = rollout_to_sequence_items(rollout, {(rollout.id, 0): 1.0})
    assert item.input_ids == [*second.prompt_token_ids, *replies[1]]
    assert _masked(item) == [*replies[0], *replies[1]]  # both calls' sampled ids, the tool result under mask 0
    tool_turn = tokenizer.decode(second.prompt_token_ids[len(head) :])
    assert tool_turn == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
