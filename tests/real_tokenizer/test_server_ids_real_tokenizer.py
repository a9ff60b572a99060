"""The server's chat route and agent programs on SmolLM2's real BPE tokenizer: the ids a reply was sampled as
("Hel" "lo" " wor" "ld", which re-encode as "Hello" " world") come back as ``token_ids``, are kept verbatim
when sent back, and are what an OpenAI-SDK program's calls train; sent back as text, the step says so."""

from __future__ import annotations

from typing import Any

import pytest

openai = pytest.importorskip("openai")

from tests.real_tokenizer.ids import EOS, HELLO_WORLD, HELLO_WORLD_CANONICAL, split_ids  # noqa: E402

from ludic.envs.letter_repeat import LetterRepeatEnv  # noqa: E402
from ludic.interaction.openai_program import OpenAIProgramProtocol, ProgramTask  # noqa: E402
from ludic.training.batching.sequence_items import rollout_to_sequence_items  # noqa: E402

pytestmark = pytest.mark.integration
SAMPLED = [*HELLO_WORLD, EOS]
USER = {"role": "user", "content": "Say hello."}
FOLLOW = {"role": "user", "content": "Again."}


def chat(client: Any, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(model="m", messages=messages, max_tokens=8, logprobs=True,
                                          extra_body={"return_token_ids": True})  # fmt: skip


def test_the_route_returns_the_sampled_ids_and_keeps_them_verbatim_when_sent_back(successor_url: str, tokenizer) -> None:
    client = openai.OpenAI(base_url=successor_url, api_key="-")
    first = chat(client, [USER])
    prompt, reply_ids = first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]
    assert reply_ids == SAMPLED and first.choices[0].message.content == "Hello world"
    assert len(first.choices[0].logprobs.content) == len(SAMPLED)
    reply = {"role": "assistant", "content": "Hello world"}
    kept = chat(client, [USER, {**reply, "token_ids": reply_ids}, FOLLOW])
    kept_ids = kept.model_extra["prompt_token_ids"]
    assert kept_ids[: len(prompt) + len(SAMPLED)] == [*prompt, *SAMPLED]
    assert "sequence_break" not in kept.model_extra
    assert tokenizer.decode(kept_ids[len(prompt) + len(SAMPLED) :]) == "\n<|im_start|>user\nAgain.<|im_end|>\n<|im_start|>assistant\n"
    # the same reply as text is re-tokenised: "Hello" " world", not the ids the model sampled
    retokenised = chat(client, [USER, reply, FOLLOW]).model_extra["prompt_token_ids"]
    assert retokenised[len(prompt) : len(prompt) + 2] == HELLO_WORLD_CANONICAL
    assert tokenizer.decode(retokenised) == tokenizer.decode(kept_ids)  # the same text, other ids


def test_ids_a_client_sends_back_for_a_reply_are_kept_as_sent(successor_url: str, tokenizer) -> None:
    """A reply sampled as another split of its text (without its end-of-turn id): those ids, then the template's."""
    client = openai.OpenAI(base_url=successor_url, api_key="-")
    text = "The answer is 12."
    ids = split_ids(tokenizer, text)
    prompt = chat(client, [USER]).model_extra["prompt_token_ids"]
    sent = chat(client, [USER, {"role": "assistant", "content": text, "token_ids": ids}, FOLLOW])
    got = sent.model_extra["prompt_token_ids"]
    assert got[: len(prompt) + len(ids)] == [*prompt, *ids]
    assert tokenizer.decode(got[len(prompt) + len(ids) :]).startswith("<|im_end|>\n<|im_start|>user\nAgain.")


async def hello_twice(client: Any, task: ProgramTask) -> str:
    """A two-call program: the reply goes back into the conversation, then a second call."""
    messages = [USER]
    first = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=8)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, FOLLOW]
    second = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=8)
    return second.choices[0].message.content


def _masked_spans(item) -> list[list[int]]:
    spans: list[list[int]] = []
    for i, (tok, flag) in enumerate(zip(item.input_ids, item.action_mask, strict=True)):
        if flag and (i == 0 or not item.action_mask[i - 1]):
            spans.append([])
        if flag:
            spans[-1].append(tok)
    return spans


async def test_a_programs_calls_stitch_into_one_sequence_of_the_sampled_ids(successor_url: str) -> None:
    protocol = OpenAIProgramProtocol(hello_twice, base_url=successor_url)
    [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=4, env_seed=1, sampling_seed=1)
    first, second = (s.trace for s in rollout.steps)
    assert first.completion_token_ids == second.completion_token_ids == SAMPLED
    assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(SAMPLED)] == [*first.prompt_token_ids, *SAMPLED]
    assert all("sequence_break" not in s.info for s in rollout.steps)
    (item,) = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    assert item.input_ids == [*second.prompt_token_ids, *SAMPLED] and _masked_spans(item) == [SAMPLED, SAMPLED]


async def test_a_program_whose_replies_go_back_as_text_trains_each_call_apart_and_says_why(successor_url: str) -> None:
    protocol = OpenAIProgramProtocol(hello_twice, base_url=successor_url, attach_token_ids=False)
    [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=4, env_seed=1, sampling_seed=1)
    first, second = (s.trace for s in rollout.steps)
    head = len(first.prompt_token_ids)
    assert second.prompt_token_ids[head : head + 2] == HELLO_WORLD_CANONICAL  # the server re-tokenised the text
    assert "previous call's prompt + completion ids" in rollout.steps[1].info["sequence_break"]
    items = rollout_to_sequence_items(rollout, {(rollout.id, s.index): 1.0 for s in rollout.steps})
    assert [_masked_spans(it) for it in items] == [[SAMPLED], [SAMPLED]]  # each call: exactly its sampled ids
    assert [it.input_ids for it in items] == [[*t.prompt_token_ids, *SAMPLED] for t in (first, second)]
