"""Replies sent back with their token ids, by a hostile client, against the real server (a subprocess on
loopback): the splice that keeps them verbatim re-renders the history once per reply, so thousands of
replies with ids must cost a bounded amount of templating, not minutes of a worker thread."""

from __future__ import annotations

import time

import httpx
import pytest

from ludic.inference.server import _exact_ids

pytestmark = pytest.mark.integration


def _chat(replies: int) -> list[dict]:
    messages: list[dict] = [{"role": "user", "content": "x"}]
    for _ in range(replies):
        messages += [{"role": "assistant", "content": "a", "token_ids": [5]}, {"role": "user", "content": "x"}]
    return messages


def test_many_replies_with_ids_are_answered_quickly(base_url: str) -> None:
    messages = _chat(1500)
    began = time.perf_counter()
    reply = httpx.post(f"{base_url}/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=60)
    elapsed = time.perf_counter() - began
    assert elapsed < 10.0, f"{elapsed:.1f} s"  # was: over a minute of templating (3 renders per reply)
    plain, ids = _exact_ids.split_reply_ids(messages)
    assert _exact_ids.splice_cost(plain, sorted(ids)) > _exact_ids.MAX_SPLICE_COST
    if reply.status_code == 200:  # the plain re-render, and the reason the ids were not kept
        assert "MAX_SPLICE_COST" in reply.json()["sequence_break"]
    else:
        assert reply.status_code == 400 and "max_position_embeddings" in reply.json()["error"]["message"]


def test_a_few_replies_with_ids_are_still_kept_verbatim(base_url: str) -> None:
    messages = _chat(3)
    plain, ids = _exact_ids.split_reply_ids(messages)
    assert _exact_ids.splice_cost(plain, sorted(ids)) < _exact_ids.MAX_SPLICE_COST
    reply = httpx.post(f"{base_url}/chat/completions", json={"messages": messages, "max_tokens": 1}, timeout=60)
    assert reply.status_code == 200 and "sequence_break" not in reply.json()
    assert reply.json()["prompt_token_ids"].count(5) >= 3
