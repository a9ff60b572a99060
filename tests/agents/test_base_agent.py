import asyncio

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.inference.sampling import SamplingConfig
from ludic.parsers import ParseResult, xml_tag_parser
from ludic.testing.scripted_client import FAKE_LOGPROB, ScriptedChatClient
from ludic.types import TokenTrace


class _ListTokenizer:
    """Stands in for a HF tokenizer: ids = [role code, content bytes..., 0] per message."""

    chat_template = "{{ fake }}"

    def __init__(self):
        self.calls = []

    def apply_chat_template(self, messages, *, add_generation_prompt, tokenize, return_dict):
        self.calls.append((add_generation_prompt, tokenize, return_dict))
        ids = []
        for m in messages:
            ids += [{"system": 1, "user": 2, "assistant": 3}[m["role"]], *m["content"].encode(), 0]
        return [*ids, 3]


def _agent(client, **kw):
    return Agent(client=client, model="m", ctx=FullDialog(), parser=xml_tag_parser("a"), **kw)


async def test_act_returns_parsed_action_and_trace_and_records_the_reply():
    client = ScriptedChatClient(["<a>hi</a>"], policy_version=7)
    agent = _agent(client)
    agent.on_env_reset("Q", {})
    parse, info = await agent.act()
    assert parse == ParseResult("hi", 0.0, None)
    assert info["raw_text"] == "<a>hi</a>"
    assert info["finish_reason"] == "stop"
    assert info["policy_version"] == 7
    assert info["trace"] == TokenTrace(
        prompt_token_ids=[81],  # fake ids: bytes of "Q"
        completion_token_ids=list(b"<a>hi</a>"),
        completion_logprobs=[FAKE_LOGPROB] * 9,
        finish_reason="stop",
    )
    assert agent.ctx.messages[-1] == {"role": "assistant", "content": "<a>hi</a>"}


async def test_with_a_tokenizer_the_agent_sends_chat_template_ids():
    tok = _ListTokenizer()
    client = ScriptedChatClient(["<a>x</a>"])
    agent = _agent(client, tokenizer=tok)
    agent.on_env_reset("Q", {})
    _, info = await agent.act()
    assert client.requests[0].prompt_token_ids == [2, 81, 0, 3]
    assert info["trace"].prompt_token_ids == [2, 81, 0, 3]
    assert tok.calls == [(True, True, False)]


def test_tokenizer_defaults_to_the_clients_tokenizer():
    tok = _ListTokenizer()
    assert _agent(ScriptedChatClient([], tokenizer=tok)).tokenizer is tok


def test_tokenizer_without_chat_template_is_rejected():
    class NoTemplate:
        chat_template = None

    with pytest.raises(ValueError, match="has no chat_template"):
        _agent(ScriptedChatClient([]), tokenizer=NoTemplate())


async def test_malformed_messages_raise_naming_the_field():
    agent = _agent(ScriptedChatClient(["x"]))
    agent.ctx.append_message({"role": "robot", "content": "hi"})
    with pytest.raises(ValueError, match=r"messages\[0\]\['role'\] must be one of"):
        await agent.act()


async def test_reply_cut_at_token_limit_is_a_parse_failure_even_if_parsable():
    agent = _agent(ScriptedChatClient([("<a>ok</a>", "length")]), incomplete_reward=-0.25)
    agent.on_env_reset("Q", {})
    parse, info = await agent.act()
    assert parse.action is None
    assert parse.reward == -0.25
    assert "cut off at the token limit" in parse.obs
    assert info["finish_reason"] == "length"


async def test_reply_cut_at_token_limit_goes_to_the_parser_by_default():
    agent = _agent(ScriptedChatClient([("<a>ok</a>", "length")]))
    agent.on_env_reset("Q", {})
    parse, info = await agent.act()
    assert parse.action == "ok"
    assert info["finish_reason"] == "length"


def test_incomplete_reward_must_be_a_finite_number_or_none():
    with pytest.raises(ValueError, match="incomplete_reward must be None"):
        _agent(ScriptedChatClient(["x"]), incomplete_reward=float("nan"))


async def test_act_uses_the_given_sampling_else_the_agents_default():
    client = ScriptedChatClient(["<a>1</a>", "<a>2</a>"])
    agent = _agent(client, sampling=SamplingConfig(max_tokens=9))
    agent.on_env_reset("Q", {})
    await agent.act()
    await agent.act(sampling=SamplingConfig(max_tokens=3, seed=5))
    assert [r.sampling.max_tokens for r in client.requests] == [9, 3]
    assert client.requests[1].sampling.seed == 5


async def test_act_timeout_raises_timeout_error():
    class Slow(ScriptedChatClient):
        async def complete(self, request):
            await asyncio.sleep(5)

    agent = _agent(Slow([]))
    agent.on_env_reset("Q", {})
    with pytest.raises(TimeoutError):
        await agent.act(timeout_s=0.01)


def test_reset_replaces_the_system_prompt_and_clears_history():
    agent = _agent(ScriptedChatClient([]))
    agent.on_env_reset("Q", {})
    agent.reset(system_prompt="S")
    assert agent.ctx.messages == [{"role": "system", "content": "S"}]
