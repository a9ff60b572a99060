"""Every model call of a turn is trained with the turn's credit; tool results are prompt."""

import json

import pytest
from transformers import AutoTokenizer

from ludic.agents import ToolAgent
from ludic.context import FullDialog
from ludic.envs import DatasetQAEnv
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.testing import tiny_model_path
from ludic.testing.scripted_client import FAKE_LOGPROB, ScriptedChatClient
from ludic.training.batching import rollouts_to_saw_items
from ludic.training.batching.jsonl import rollout_from_dict, rollout_to_dict


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _call(args):
    return "<tool_call>" + json.dumps({"name": "add", "arguments": args}) + "</tool_call>"


REPLIES = [_call({"a": 2, "b": 3}), _call({"a": 5, "b": 1}), "<answer>6</answer>"]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(tiny_model_path())


async def _play(tokenizer):
    client = ScriptedChatClient(REPLIES, tokenizer=tokenizer)
    agent = ToolAgent(
        client=client,
        model="m",
        ctx=FullDialog(system_prompt="Be exact."),
        parser=xml_tag_parser("answer"),
        tools=[add],
        max_tool_rounds=2,
    )
    env = DatasetQAEnv({"question": "What is 2+3+1?", "answer": "6"})
    (rollout,) = await SingleAgentProtocol(agent).run(env=env, max_steps=1)
    return rollout, client


async def test_a_turn_with_two_tool_calls_trains_all_three_calls_with_exact_masks(tokenizer):
    rollout, client = await _play(tokenizer)
    assert rollout.total_reward == 1.0 and len(rollout.steps) == 1
    items = rollouts_to_saw_items([rollout], {(rollout.id, 0): 0.75})
    assert len(items) == 3
    for item, request, reply in zip(items, client.requests, REPLIES, strict=True):
        prompt, completion = request.prompt_token_ids, list(reply.encode())
        assert item.input_ids == prompt + completion  # exactly what was sent, then exactly what was sampled
        assert item.action_mask == [0] * len(prompt) + [1] * len(completion)
        assert item.weight == 0.75
        assert item.attachments.actor_logps.token_logps == [FAKE_LOGPROB] * len(completion)
    assert [(it.meta["call_index"], it.meta["tool_call"]) for it in items] == [(0, True), (1, True), (2, False)]

    # the tool results are in the later calls' prompts, under action_mask 0, never in an action
    tool_turn_1 = '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call><|im_end|>\n<|im_start|>tool\n5<|im_end|>\n'
    tool_turn_2 = '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 5, "b": 1}}</tool_call><|im_end|>\n<|im_start|>tool\n6<|im_end|>\n'
    prompts = [tokenizer.decode(r.prompt_token_ids) for r in client.requests]
    assert prompts[0].startswith('<|im_start|>system\nBe exact.\n\n# Tools\nYou may call these functions:\n{"type": "function"')
    assert prompts[1].endswith(tool_turn_1 + "<|im_start|>assistant\n")
    assert prompts[2].endswith(tool_turn_1 + tool_turn_2 + "<|im_start|>assistant\n")
    # each later prompt extends the previous prompt + the sampled call, token for token
    assert prompts[1].startswith(prompts[0] + REPLIES[0])
    assert prompts[2].startswith(prompts[1] + REPLIES[1])


async def test_tool_traces_survive_the_jsonl_round_trip(tokenizer):
    rollout, _ = await _play(tokenizer)
    again = rollout_from_dict(json.loads(json.dumps(rollout_to_dict(rollout))))
    assert again.steps[0].tool_traces == rollout.steps[0].tool_traces
    assert len(again.steps[0].tool_traces) == 2


async def test_a_tool_call_reply_without_token_ids_is_an_error_not_dropped(tokenizer):
    rollout, _ = await _play(tokenizer)
    rollout.steps[0].tool_traces[1] = None
    with pytest.raises(ValueError, match=r"missing rollout-time token trace for rollout .* step 0 call 1"):
        rollouts_to_saw_items([rollout], {(rollout.id, 0): 1.0})


async def test_react_agent_trains_every_call_including_the_one_past_its_budget(tokenizer):
    from ludic.agents import ReActAgent

    replies = [_call({"a": 1, "b": 1}), _call({"a": 2, "b": 2}), "<answer>2</answer>"]
    client = ScriptedChatClient(replies, tokenizer=tokenizer)
    agent = ReActAgent(
        client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("answer"), tools=[add], max_react_steps=1
    )
    env = DatasetQAEnv({"question": "1+1?", "answer": "2"})
    (rollout,) = await SingleAgentProtocol(agent).run(env=env, max_steps=1)
    items = rollouts_to_saw_items([rollout], {(rollout.id, 0): -0.5})
    assert [it.meta["tool_call"] for it in items] == [True, True, False]
    for item, request, reply in zip(items, client.requests, replies, strict=True):
        n = len(request.prompt_token_ids)
        assert item.action_mask == [0] * n + [1] * len(reply.encode()) and item.weight == -0.5
    last_prompt = tokenizer.decode(client.requests[2].prompt_token_ids)
    assert last_prompt.endswith(
        "<|im_start|>user\nYou have used all 1 tool steps. Give your final answer now, without tool calls."
        "<|im_end|>\n<|im_start|>assistant\n"
    )
