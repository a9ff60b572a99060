"""The chat route through the real ``openai`` SDK: exact ids out, and replies' ids accepted back verbatim."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

openai = pytest.importorskip("openai")

from ludic.envs.letter_repeat import LetterRepeatEnv  # noqa: E402
from ludic.interaction.openai_program import OpenAIProgramProtocol  # noqa: E402
from ludic.testing import build_tiny_model  # noqa: E402
from ludic.testing.server_process import running_server  # noqa: E402

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def rewriting_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server whose template rewrites history: an assistant turn shows its text only while it is last."""
    model = build_tiny_model(tmp_path_factory.mktemp("rewriting"), seed=0)
    template = (model / "chat_template.jinja").read_text()
    shown = "(message['content'] or '')"
    assert shown in template
    hidden = "((message['content'] or '') if message['role'] != 'assistant' or loop.last else '(earlier reply)')"
    (model / "chat_template.jinja").write_text(template.replace(shown, hidden))
    with running_server(model) as url:
        yield url + "/v1"


def chat(client: Any, messages: list[dict[str, Any]]) -> Any:
    return client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, seed=1, logprobs=True,
                                          extra_body={"return_token_ids": True})  # fmt: skip


def test_reply_sent_back_with_its_token_ids_is_kept_verbatim(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="-")
    first = chat(client, [{"role": "user", "content": "Repeat a 4 times."}])
    prompt, reply_ids = first.model_extra["prompt_token_ids"], first.choices[0].model_extra["token_ids"]
    assert len(reply_ids) == len(first.choices[0].logprobs.content) == 6
    reply = {"role": "assistant", "content": first.choices[0].message.content}
    follow = {"role": "user", "content": "Revise."}
    user = {"role": "user", "content": "Repeat a 4 times."}
    kept = chat(client, [user, {**reply, "token_ids": reply_ids}, follow]).model_extra["prompt_token_ids"]
    assert kept[: len(prompt) + 6] == [*prompt, *reply_ids]
    retokenised = chat(client, [user, reply, follow]).model_extra["prompt_token_ids"]
    assert retokenised[: len(prompt) + 6] != [*prompt, *reply_ids]  # what the route did before: re-tokenise


def test_token_ids_on_a_user_message_are_refused_naming_it(base_url: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.token_ids"):
        chat(client, [{"role": "user", "content": "hi", "token_ids": [1, 2]}])
    with pytest.raises(openai.BadRequestError, match=r"messages\[1\]\.token_ids must be a non-empty list"):
        chat(client, [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "token_ids": [-1]}])


async def test_a_template_that_rewrites_history_splits_the_episode_and_says_why(rewriting_url: str) -> None:
    async def draft_then_revise(client: Any, task: Any) -> str:
        messages = [{"role": "user", "content": task.prompt}]
        first = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=4)
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Revise."}]  # fmt: skip
        second = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=4)
        return second.choices[0].message.content

    protocol = OpenAIProgramProtocol(draft_then_revise, base_url=rewriting_url)
    [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=2, env_seed=0, sampling_seed=0)
    why = rollout.steps[1].info["sequence_break"]
    assert why.startswith("the chat template rewrote the history: messages[1]: the chat template renders")
