"""Tool calls on Ludic's server through the real ``openai`` SDK: call -> tool result -> answer, streamed and not.

A random tiny model never writes a tool call, so the served model is the tiny model fitted (a few
dozen full-batch steps) to reply, greedily, with chosen texts to chosen prompts: a Hermes
``<tool_call>`` to a calculator question, the answer once the tool's result is in the chat, and a
malformed call to another question. Nothing in the server knows it is being tested.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

openai = pytest.importorskip("openai")

from ludic.envs.letter_repeat import LetterRepeatEnv  # noqa: E402
from ludic.interaction.openai_program import OpenAIProgramProtocol  # noqa: E402
from ludic.testing import build_tiny_model  # noqa: E402
from ludic.testing.server_process import running_server, start_server  # noqa: E402

pytestmark = pytest.mark.integration

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate a product a*b",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
QUESTION = [{"role": "user", "content": "What is 6*7?"}]
CALL_TEXT = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
ANSWER = "The answer is 42."
BROKEN_QUESTION = [{"role": "user", "content": "What is 2*3?"}]
BROKEN_TEXT = 'Let me see. <tool_call>{"name": "calculator", "arguments": {"expression": </tool_call>'


def calculator(expression: str) -> str:
    """The tool: a product of two integers."""
    a, b = expression.split("*")
    return str(int(a) * int(b))


def after_call(call_id: str = "call_x") -> list[dict[str, Any]]:
    """The chat once the model called the calculator and the tool answered (as an SDK program sends it)."""
    arguments = json.dumps({"expression": "6*7"})
    call = {"id": call_id, "type": "function", "function": {"name": "calculator", "arguments": arguments}}
    return [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": calculator("6*7")}]  # fmt: skip


def spliced_after_call() -> list[dict[str, Any]]:
    """The same chat as the server renders it when the call comes back with its ``token_ids``: as sampled."""
    return [*QUESTION, {"role": "assistant", "content": CALL_TEXT},
            {"role": "tool", "tool_call_id": "call_x", "content": calculator("6*7")}]  # fmt: skip


def fit_replies(model_dir: Path, examples: list[tuple[list[dict[str, Any]], str]], tools: list[dict]) -> None:
    """Train the model in place until greedy decoding gives each example's reply to its chat (then a margin)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    render = tokenizer.apply_chat_template
    fit_texts(model_dir, [(render(m, tools=tools, add_generation_prompt=True, tokenize=False), r) for m, r in examples])


def fit_texts(model_dir: Path, examples: list[tuple[str, str]]) -> None:
    """``fit_replies`` on prompts given as rendered text: each reply (+ end of turn) becomes greedy after its prompt."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    rows = []
    for text, reply in examples:
        prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
        ids = prompt + tokenizer(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
        rows.append((torch.tensor([ids]), len(prompt)))
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    extra = None
    for _ in range(600):
        loss = sum(torch.nn.functional.cross_entropy(model(x).logits[0, n - 1 : -1], x[0, n:]) for x, n in rows)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if extra is None:
            with torch.no_grad():
                if all(bool((model(x).logits[0, n - 1 : -1].argmax(-1) == x[0, n:]).all()) for x, n in rows):
                    extra = 30  # fitted: a few more steps so batching's rounding cannot flip a token
        else:
            extra -= 1
            if extra == 0:
                break
    assert extra == 0, "the tiny model did not fit the scripted replies"
    model.save_pretrained(model_dir)


@pytest.fixture(scope="module")
def tool_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    small = {"hidden_size": 64, "num_layers": 2, "num_heads": 2, "num_kv_heads": 1, "intermediate_size": 128}
    model_dir = build_tiny_model(tmp_path_factory.mktemp("tool-model"), seed=0, **small)
    examples = [(QUESTION, CALL_TEXT), (after_call(), ANSWER), (BROKEN_QUESTION, BROKEN_TEXT),
                (spliced_after_call(), ANSWER)]  # fmt: skip
    fit_replies(model_dir, examples, [CALCULATOR])
    return model_dir


@pytest.fixture(scope="module")
def tool_url(tool_model: Path) -> Iterator[str]:
    with running_server(tool_model) as url:  # --tool-parser auto: the tiny template's <tool_call> -> hermes
        yield url + "/v1"


def ask(client: Any, messages: list[dict[str, Any]], **kwargs: Any) -> Any:
    return client.chat.completions.create(model="tiny", messages=messages, tools=[CALCULATOR], temperature=0,
                                          max_tokens=120, **kwargs)  # fmt: skip


def run_tool_calls(message: Any) -> list[dict[str, Any]]:
    """What an SDK program does with a reply's calls: run each, answer with a tool message."""
    return [{"role": "tool", "tool_call_id": call.id, "content": calculator(**json.loads(call.function.arguments))}
            for call in message.tool_calls]  # fmt: skip


def test_a_calculator_call_round_trips_through_the_openai_sdk(tool_url: str) -> None:
    client = openai.OpenAI(base_url=tool_url, api_key="-", max_retries=0)
    first = ask(client, QUESTION, logprobs=True)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == ("function", "calculator",
                                                                                   {"expression": "6*7"})  # fmt: skip
    # what is recorded and trained is still the whole reply: its ids spell the call text, one log-prob each
    reply_ids = choice.model_extra["token_ids"]
    assert bytes(t - 3 for t in reply_ids[:-1]).decode() == CALL_TEXT  # byte-level ids: byte b is id b + 3
    assert len(choice.logprobs.content) == len(reply_ids)
    messages = [*QUESTION, choice.message.model_dump(exclude_none=True), *run_tool_calls(choice.message)]
    final = ask(client, messages).choices[0]
    assert (final.message.content, final.message.tool_calls, final.finish_reason) == (ANSWER, None, "stop")


async def test_a_streamed_call_round_trips_through_the_sdk_accumulator(tool_url: str) -> None:
    from openai.lib.streaming.chat import (
        ChatCompletionStreamState,  # what client.chat.completions.stream() uses
    )

    client = openai.AsyncOpenAI(base_url=tool_url, api_key="-", max_retries=0)
    kwargs = {"model": "tiny", "tools": [CALCULATOR], "temperature": 0, "max_tokens": 120}
    state, events = ChatCompletionStreamState(), []
    async for chunk in await client.chat.completions.create(messages=QUESTION, stream=True, **kwargs):
        events += [event.type for event in state.handle_chunk(chunk)]
    first = state.get_final_completion()
    assert "tool_calls.function.arguments.done" in events
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls"
    [call] = message.tool_calls
    assert call.id.startswith("call_") and call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "6*7"}
    messages = [*QUESTION, message.model_dump(exclude_none=True, exclude={"parsed"}), *run_tool_calls(message)]
    chunks = [c async for c in await client.chat.completions.create(messages=messages, stream=True,
                                                                    stream_options={"include_usage": True}, **kwargs)]  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage.completion_tokens == len(ANSWER) + 1  # one byte-level id per character + <|im_end|>


def test_a_streamed_reply_keeps_the_whole_replys_ids(tool_url: str) -> None:
    body = {"model": "tiny", "messages": QUESTION, "tools": [CALCULATOR], "temperature": 0, "max_tokens": 120,
            "stream": True, "logprobs": True}  # fmt: skip
    with httpx.stream("POST", tool_url + "/chat/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(line) for line in lines[:-1]]
    last = chunks[-1]["choices"][0]
    assert bytes(t - 3 for t in last["token_ids"][:-1]).decode() == CALL_TEXT
    assert len(last["logprobs"]["content"]) == len(last["token_ids"])
    assert chunks[0]["prompt_token_ids"] and last["finish_reason"] == "tool_calls"


async def test_an_agent_programs_tool_call_episode_trains_as_one_exact_sequence(tool_url: str) -> None:
    async def calculator_agent(client: Any, task: Any) -> float:
        messages: list[Any] = list(QUESTION)
        kwargs = {"model": task.model, "tools": [CALCULATOR], "temperature": 0, "max_tokens": 120}
        first = (await client.chat.completions.create(messages=messages, **kwargs)).choices[0].message
        messages += [first.model_dump(exclude_none=True), *run_tool_calls(first)]
        final = (await client.chat.completions.create(messages=messages, **kwargs)).choices[0].message
        return float(final.content == ANSWER)

    protocol = OpenAIProgramProtocol(calculator_agent, base_url=tool_url)
    [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=2, env_seed=0, sampling_seed=0)
    call, answer = rollout.steps
    assert answer.reward == 1.0
    assert call.action == CALL_TEXT  # the step keeps the reply as sampled, not the emptied content
    assert bytes(t - 3 for t in call.trace.completion_token_ids[:-1]).decode() == CALL_TEXT
    # the tool-call reply went back with its ids: the answer's prompt extends the call's exact ids
    head = [*call.trace.prompt_token_ids, *call.trace.completion_token_ids]
    assert answer.trace.prompt_token_ids[: len(head)] == head
    assert "sequence_break" not in answer.info


def test_tool_choice_none_leaves_the_call_as_text(tool_url: str) -> None:
    client = openai.OpenAI(base_url=tool_url, api_key="-", max_retries=0)
    choice = ask(client, QUESTION, tool_choice="none").choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (CALL_TEXT, None, "stop")
    assert ask(client, QUESTION, tool_choice="auto").choices[0].message.tool_calls  # the same reply, read


def test_a_malformed_call_stays_plain_content(tool_url: str) -> None:
    client = openai.OpenAI(base_url=tool_url, api_key="-", max_retries=0)
    choice = ask(client, BROKEN_QUESTION).choices[0]
    assert (choice.message.content, choice.message.tool_calls, choice.finish_reason) == (BROKEN_TEXT, None, "stop")


NAMED = {"type": "function", "function": {"name": "calculator"}}
FORCED_TEXT = {"required": "<tool_call>", "named": '<tool_call>{"name": "calculator", "arguments":'}


def spelled(ids: list[int]) -> str:
    return bytes(t - 3 for t in ids).decode()  # byte-level ids: byte b is id b + 3


@pytest.mark.parametrize("which", ["required", "named"])
def test_tool_choice_forces_a_call_whose_opening_is_prompt_not_action(tool_url: str, which: str) -> None:
    client = openai.OpenAI(base_url=tool_url, api_key="-", max_retries=0)
    forced_reply = ask(client, QUESTION, tool_choice=NAMED if which == "named" else "required", logprobs=True)
    choice = forced_reply.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == ("calculator", {"expression": "6*7"})
    forced, sampled = choice.model_extra["forced_token_ids"], choice.model_extra["token_ids"]
    assert spelled(forced) == FORCED_TEXT[which]
    # the forced opening ends the prompt: it was not sampled, so it is never an action token
    auto = ask(client, QUESTION, logprobs=True)
    assert forced_reply.model_extra["prompt_token_ids"] == auto.model_extra["prompt_token_ids"] + forced
    assert spelled(sampled[:-1]) == CALL_TEXT[len(FORCED_TEXT[which]) :]
    assert choice.model_extra["text"] == CALL_TEXT  # the whole assistant turn, as the next prompt holds it
    assert len(choice.logprobs.content) == len(sampled)  # one log-prob per sampled token, none for forced ones
    auto_logprobs = [entry.logprob for entry in auto.choices[0].logprobs.content][len(forced) :]
    assert [entry.logprob for entry in choice.logprobs.content] == pytest.approx(auto_logprobs, abs=1e-4)


async def test_a_forced_call_streams_and_its_episode_trains_as_one_exact_sequence(tool_url: str) -> None:
    from openai.lib.streaming.chat import ChatCompletionStreamState

    client = openai.AsyncOpenAI(base_url=tool_url, api_key="-", max_retries=0)
    state = ChatCompletionStreamState()
    async for chunk in await client.chat.completions.create(model="tiny", messages=QUESTION, tools=[CALCULATOR],
                                                            tool_choice=NAMED, temperature=0, max_tokens=120,
                                                            stream=True):  # fmt: skip
        state.handle_chunk(chunk)
    [call] = state.get_final_completion().choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"expression": "6*7"}

    async def forced_agent(client: Any, task: Any) -> float:
        messages: list[Any] = list(QUESTION)
        kwargs = {"model": task.model, "tools": [CALCULATOR], "temperature": 0, "max_tokens": 120}
        first = (await client.chat.completions.create(messages=messages, tool_choice="required", **kwargs)).choices[0]
        messages += [first.message.model_dump(exclude_none=True), *run_tool_calls(first.message)]
        final = (await client.chat.completions.create(messages=messages, **kwargs)).choices[0].message
        return float(final.content == ANSWER)

    protocol = OpenAIProgramProtocol(forced_agent, base_url=tool_url)
    [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=2, env_seed=0, sampling_seed=0)
    call_step, answer = rollout.steps
    assert answer.reward == 1.0 and call_step.action == CALL_TEXT
    assert spelled(call_step.trace.prompt_token_ids[-len("<tool_call>") :]) == "<tool_call>"
    assert spelled(call_step.trace.completion_token_ids[:-1]) == CALL_TEXT[len("<tool_call>") :]
    # the call went back with its forced opening and sampled ids: the answer's prompt extends both exactly
    head = [*call_step.trace.prompt_token_ids, *call_step.trace.completion_token_ids]
    assert answer.trace.prompt_token_ids[: len(head)] == head
    assert "sequence_break" not in answer.info


def test_a_forced_reply_that_is_no_call_comes_back_as_content_saying_why(tool_url: str) -> None:
    client = openai.OpenAI(base_url=tool_url, api_key="-", max_retries=0)
    choice = client.chat.completions.create(model="tiny", messages=QUESTION, tools=[CALCULATOR], tool_choice=NAMED,
                                            temperature=0, max_tokens=3).choices[0]  # fmt: skip
    assert choice.message.tool_calls is None and choice.finish_reason == "length"
    assert choice.message.content == FORCED_TEXT["named"] + ' {"'  # the cut continuation (3 byte tokens), after the forced opening
    assert "does not read as a tool call" in choice.model_extra["tool_choice_unmet"]


def test_tool_choice_refusals_name_what_is_wrong(tool_url: str) -> None:
    client = openai.OpenAI(base_url=tool_url, api_key="-", max_retries=0)
    other = {"type": "function", "function": {"name": "weather"}}
    with pytest.raises(openai.BadRequestError, match="'weather', which is not among the request's tools"):
        ask(client, QUESTION, tool_choice=other)
    with pytest.raises(openai.BadRequestError, match="needs tools"):
        client.chat.completions.create(model="tiny", messages=QUESTION, tool_choice="required")
    with pytest.raises(openai.BadRequestError, match="tool_choice must be"):
        client.chat.completions.create(model="tiny", messages=QUESTION, extra_body={"tool_choice": "sometimes"})


USER_PARSER = '''
from ludic.inference.tool_parsers import ParsedReply, ParsedToolCall, HermesToolParser


class ShoutingParser:
    """A user's parser: Hermes calls, with the function name upper-cased."""

    name = "shouting"

    def parse(self, text):
        parsed = HermesToolParser().parse(text)
        return ParsedReply(parsed.content, [ParsedToolCall(c.name.upper(), c.arguments) for c in parsed.tool_calls])
'''


@pytest.mark.slow  # a server of its own
def test_a_users_parser_named_on_the_command_line_reads_the_replies(
    tool_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_tool_parser.py").write_text(USER_PARSER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]))
    with running_server(tool_model, ["--tool-parser", "my_tool_parser:ShoutingParser"]) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="-", max_retries=0)
        [call] = ask(client, QUESTION).choices[0].message.tool_calls
    assert call.function.name == "CALCULATOR"


@pytest.mark.slow  # a server of its own
def test_an_unknown_tool_parser_stops_the_server_naming_the_choices(tool_model: Path) -> None:
    with pytest.raises(RuntimeError, match=r"--tool-parser: unknown tool parser 'qwen9'.*hermes.*llama3_json"):
        start_server(tool_model, "--tool-parser", "qwen9")


def streamed_chunks(url: str, **fields: Any) -> list[dict[str, Any]]:
    body = {"model": "tiny", "messages": QUESTION, "tools": [CALCULATOR], "temperature": 0, "max_tokens": 120,
            "stream": True, **fields}  # fmt: skip
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=60) as response:
        lines = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("tool_choice", ["auto", "required", "named"])
def test_a_streamed_calls_arguments_arrive_fragment_by_fragment_while_decoding(tool_url: str, tool_choice: str) -> None:
    choice = NAMED if tool_choice == "named" else tool_choice
    chunks = streamed_chunks(tool_url, tool_choice=choice)
    whole = httpx.post(tool_url + "/chat/completions", timeout=60, json={"model": "tiny", "messages": QUESTION,
                       "tools": [CALCULATOR], "temperature": 0, "max_tokens": 120, "tool_choice": choice}).json()  # fmt: skip
    [expected] = whole["choices"][0]["message"]["tool_calls"]
    deltas = [(at, d) for at, c in enumerate(chunks) if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])]
    (named_at, named), *rest = deltas
    assert named_at < rest[0][0]
    assert named == {"index": 0, "id": named["id"], "type": "function",
                     "function": {"name": "calculator", "arguments": ""}}  # fmt: skip
    assert all(set(d) == {"index", "function"} and d["index"] == 0 for _, d in rest)
    fragments = [d["function"]["arguments"] for _, d in rest]
    # the old server sent the arguments whole, in one chunk, once the reply had ended
    assert len(fragments) >= 2, f"the arguments came in {len(fragments)} chunk(s): {fragments}"
    assert "".join(fragments) == expected["function"]["arguments"]  # exactly the non-streamed call's text
    assert rest[0][0] < len(chunks) - 2  # the first fragment was sent while the reply was still being decoded
    last = chunks[-1]["choices"][0]
    assert last["finish_reason"] == "tool_calls"
    assert last["token_ids"] == whole["choices"][0]["token_ids"]  # the trained sequence does not depend on streaming
    assert not any(c["choices"][0]["delta"].get("content") for c in chunks if c["choices"])


def test_the_sdks_stream_helper_rebuilds_the_non_streamed_call(tool_url: str) -> None:
    client = openai.OpenAI(base_url=tool_url, api_key="-", max_retries=0)
    kwargs = {"model": "tiny", "messages": QUESTION, "tools": [CALCULATOR], "temperature": 0, "max_tokens": 120}
    with client.chat.completions.stream(**kwargs) as stream:
        fragments = [event.arguments_delta for event in stream if event.type == "tool_calls.function.arguments.delta" and event.arguments_delta]
        final = stream.get_final_completion().choices[0]
    whole = client.chat.completions.create(**kwargs).choices[0]
    [streamed_call], [call] = final.message.tool_calls, whole.message.tool_calls
    assert (streamed_call.function.name, streamed_call.function.arguments) == (call.function.name, call.function.arguments)
    assert len(fragments) >= 2 and final.finish_reason == whole.finish_reason == "tool_calls"


def test_a_call_that_proves_malformed_after_it_began_streaming_ends_as_content(tool_url: str) -> None:
    chunks = streamed_chunks(tool_url, messages=BROKEN_QUESTION)
    deltas = [d for c in chunks if c["choices"] for d in c["choices"][0]["delta"].get("tool_calls", [])]
    # what of the call went out while it was still well formed stays out (streamed text cannot be taken back);
    # how much that is depends on how many tokens each decode step caught up on (tokens that came while a chunk
    # was being sent are read together), so a loaded machine may send less of it, or none. The character-by-
    # character case, where all of '{"expression": ' goes out, is test_tool_call_streaming_properties.py's.
    if deltas:
        assert deltas[0]["function"] == {"name": "calculator", "arguments": ""}
        assert '{"expression": '.startswith("".join(d["function"]["arguments"] for d in deltas))
    content = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    last = chunks[-1]["choices"][0]
    assert (content, last["finish_reason"]) == (BROKEN_TEXT, "stop")  # as the non-streamed reply: plain content
