"""Malformed tool calls in a chat's messages, against the real server (a subprocess on loopback): a call the
chat template cannot render is a 400 naming it, never a 500; malformed JSON arguments are the client's text."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.integration


def _chat(base_url: str, tool_calls: object) -> httpx.Response:
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": tool_calls},
                {"role": "user", "content": "ok"}]  # fmt: skip
    return httpx.post(f"{base_url}/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=60)


@pytest.mark.parametrize("tool_calls", [[{"id": "1", "type": "function"}], "x"])
def test_a_tool_call_the_template_cannot_render_is_a_named_400(base_url: str, tool_calls: object) -> None:
    reply = _chat(base_url, tool_calls)
    assert reply.status_code == 400, reply.text[:200]  # was: 500 internal error: UndefinedError
    assert "the chat template cannot render the messages: UndefinedError" in reply.json()["error"]["message"]


def test_malformed_json_arguments_are_rendered_as_the_clients_text(base_url: str) -> None:
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{bad"}}
    assert _chat(base_url, [call]).status_code == 200
