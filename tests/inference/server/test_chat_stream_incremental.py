"""``stream=true`` sends tokens as they are decoded: the first content arrives long before the reply ends, and
what the chunks add up to is the non-streamed reply (content, stop strings, ids), through httpx and the real
``openai`` SDK against a real server process on loopback."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from ludic.testing import build_tiny_model
from ludic.testing.server_process import running_server

pytestmark = pytest.mark.integration
LONG = 240
QUESTION = [{"role": "user", "content": "Tell me a long story."}]


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    model: Path = build_tiny_model(tmp_path_factory.mktemp("stream-model"), seed=0)
    with running_server(model) as base:
        yield base + "/v1"


def chat(url: str, **fields: Any) -> dict[str, Any]:
    body = {"model": "tiny", "messages": QUESTION, "temperature": 1.0, **fields}
    response = httpx.post(url + "/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def streamed(url: str, **fields: Any) -> tuple[list[tuple[float, dict[str, Any]]], float]:
    """The chunks with the seconds after the request each arrived, and the seconds until [DONE]."""
    body = {"model": "tiny", "messages": QUESTION, "temperature": 1.0, "stream": True, **fields}
    chunks, start = [], time.perf_counter()
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line == "data: [DONE]":
                return chunks, time.perf_counter() - start
            if line.startswith("data: "):
                chunks.append((time.perf_counter() - start, json.loads(line[len("data: ") :])))
    raise AssertionError("the stream ended without [DONE]")


@pytest.fixture(scope="module")
def long_seed(url: str) -> tuple[int, dict[str, Any]]:
    """A sampling seed whose reply runs to max_tokens (the tiny random model may end a reply any time)."""
    for seed in range(40):
        reply = chat(url, seed=seed, max_tokens=LONG)
        if reply["choices"][0]["finish_reason"] == "length":
            return seed, reply
    raise AssertionError("no seed in 0..39 gave a reply of max_tokens")


def content_of(chunks: list[tuple[float, dict[str, Any]]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for _, c in chunks if c.get("choices"))


def test_content_arrives_as_it_is_decoded_and_adds_up_to_the_whole_reply(url: str, long_seed: tuple[int, dict[str, Any]]) -> None:
    seed, whole = long_seed
    chunks, total = streamed(url, seed=seed, max_tokens=LONG)
    with_content = [at for at, c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert len(with_content) >= 10, f"{len(with_content)} content chunks for a {LONG}-token reply"
    assert with_content[0] < 0.5 * total, f"first content after {with_content[0]:.2f} s of {total:.2f} s"
    assert with_content[-1] - with_content[0] > 0.3 * total  # spread over the decoding, not sent at the end
    last = chunks[-1][1]["choices"][0]
    assert content_of(chunks) == whole["choices"][0]["message"]["content"]
    assert last["token_ids"] == whole["choices"][0]["token_ids"] and last["finish_reason"] == "length"
    assert chunks[0][1]["prompt_token_ids"] == whole["prompt_token_ids"]


def test_a_stop_string_never_streams_and_the_content_matches_the_non_streamed_cut(url: str, long_seed: tuple[int, dict[str, Any]]) -> None:
    seed, whole = long_seed
    text = whole["choices"][0]["message"]["content"]
    stop = next(text[i : i + 3] for i in range(40, len(text)) if "\ufffd" not in text[i : i + 3])
    cut = chat(url, seed=seed, max_tokens=LONG, stop=[stop])["choices"][0]
    chunks, _ = streamed(url, seed=seed, max_tokens=LONG, stop=[stop])
    assert cut["message"]["content"] == text[: text.index(stop)]
    assert content_of(chunks) == cut["message"]["content"]
    assert all(stop not in (c["choices"][0]["delta"].get("content") or "") for _, c in chunks if c["choices"])


def test_the_openai_sdk_reads_an_incremental_stream(url: str, long_seed: tuple[int, dict[str, Any]]) -> None:
    openai = pytest.importorskip("openai")
    seed, whole = long_seed
    client = openai.OpenAI(base_url=url, api_key="-", max_retries=0)
    stream = client.chat.completions.create(model="tiny", messages=QUESTION, temperature=1.0, seed=seed,
                                            max_tokens=LONG, stream=True, stream_options={"include_usage": True})  # fmt: skip
    parts = [c for c in stream]
    assert "".join(c.choices[0].delta.content or "" for c in parts if c.choices) == whole["choices"][0]["message"]["content"]
    assert parts[-1].usage.completion_tokens == LONG


def test_an_error_before_the_first_token_keeps_its_status(url: str) -> None:
    body = {"model": "tiny", "messages": QUESTION, "stream": True, "max_tokens": 10**7}
    response = httpx.post(url + "/chat/completions", json=body, timeout=60)
    assert response.status_code == 400 and "max_position_embeddings" in response.json()["error"]["message"]
