"""``/pause`` and ``/resume`` on Ludic's server (a real subprocess), with vLLM's three modes.

Greedy decoding of the tiny model from ``PROMPT`` repeats one token and never emits EOS, so a
request runs until ``max_tokens``: long enough to be caught in flight by a pause.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from transformers import AutoModelForCausalLM

from ludic.distributed import BroadcastPolicyPublisher
from ludic.inference import VLLMChatClient
from ludic.inference.http_client import RequestRefused
from ludic.testing.server_process import running_server

pytestmark = pytest.mark.integration
KEY = "pause-test-key"
PROMPT = [5, 6, 7, 8]
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def server(dirs: tuple[Path, Path]) -> Iterator[str]:
    with running_server(dirs[0], ["--api-key", KEY, "--transfer-timeout", "20"]) as url:
        yield url


async def complete(http: httpx.AsyncClient, url: str, max_tokens: int) -> dict[str, Any]:
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": 0, "return_token_ids": True}
    reply = await http.post(url + "/v1/completions", json=body, headers=AUTH, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]


async def until(client: VLLMChatClient, fields: str, n: int, timeout_s: float = 60.0) -> None:
    """Poll ``/is_paused`` until the sum of ``fields`` (running, queued, held) reaches ``n``."""
    deadline = time.monotonic() + timeout_s
    while True:
        state = await client.get_json("/is_paused")
        if sum(state[f] for f in fields.split("+")) >= n:
            return
        assert time.monotonic() < deadline, f"{fields} never reached {n}: {state}"
        await asyncio.sleep(0.02)


def test_pause_routes_need_the_token_and_refuse_bad_options(server):
    assert httpx.post(server + "/pause").status_code == 401
    assert httpx.post(server + "/resume").status_code == 401
    client = VLLMChatClient(base_url=server, api_key=KEY)
    with pytest.raises(RequestRefused, match=r"unknown pause mode 'freeze': mode must be one of \['abort', 'wait', 'keep'\]") as err:
        client.pause_sync("freeze")
    assert err.value.status == 400
    bad_cache = httpx.post(server + "/pause?mode=keep&clear_cache=maybe", headers=AUTH)
    assert bad_cache.status_code == 400 and "clear_cache must be true or false" in bad_cache.text
    assert client.is_paused_sync() is False


def test_a_start_that_pauses_is_undone_when_the_start_is_refused(server):
    """Ludic's ``/start_weight_update {"pause": mode}``: a bad mode is a 400, and a start refused after the
    pause (another publisher's update in progress: 409) leaves the server running, not paused."""
    client = VLLMChatClient(base_url=server, api_key=KEY, enable_weight_updates=True)
    client.post_json_sync("/init_weight_transfer_engine", {"init_info": {"backend": "shm"}})
    other = client.post_json_sync("/start_weight_update", {})["update_id"]
    try:
        bad = httpx.post(server + "/start_weight_update", json={"pause": "freeze"}, headers=AUTH)
        assert bad.status_code == 400 and "unknown pause mode 'freeze'" in bad.text
        busy = httpx.post(server + "/start_weight_update", json={"pause": "keep"}, headers=AUTH)
        assert busy.status_code == 409 and client.is_paused_sync() is False
    finally:
        client.post_json_sync("/ludic/abort_weight_update", {"update_id": other})


def test_a_paused_server_holds_new_requests_and_serves_them_on_resume(server):
    async def go() -> None:
        client = VLLMChatClient(base_url=server, api_key=KEY)
        assert (await client.pause())["in_flight"] == 0
        assert await client.is_paused()
        async with httpx.AsyncClient() as http:
            tasks = [asyncio.create_task(complete(http, server, 8)) for _ in range(3)]
            await until(client, "held", 3)
            await asyncio.sleep(0.3)
            assert not any(t.done() for t in tasks)  # held, not refused and not started
            assert (await client.resume())["status"] == "resumed"
            choices = await asyncio.gather(*tasks)
        assert [(c["finish_reason"], len(c["token_ids"])) for c in choices] == [("length", 8)] * 3
        assert not await client.is_paused()
        await client.aclose()

    asyncio.run(go())


def test_pause_abort_ends_in_flight_requests_with_what_they_have(server):
    async def go() -> None:
        client = VLLMChatClient(base_url=server, api_key=KEY)
        async with httpx.AsyncClient() as http:
            tasks = [asyncio.create_task(complete(http, server, 1500)) for _ in range(3)]
            await until(client, "running+queued", 3)
            await until(client, "running", 1)
            assert (await client.pause("abort"))["in_flight"] == 3
            choices = await asyncio.gather(*tasks)  # answered during the pause
            late = asyncio.create_task(complete(http, server, 4))
            await until(client, "held", 1)
            await client.resume()
            late_choice = await late
        assert [c["finish_reason"] for c in choices] == ["abort"] * 3
        assert all(len(c["token_ids"]) < 1500 for c in choices)
        assert max(len(c["token_ids"]) for c in choices) >= 1  # a decoding one returns its partial output
        assert (late_choice["finish_reason"], len(late_choice["token_ids"])) == ("length", 4)
        await client.aclose()

    asyncio.run(go())


def test_pause_wait_returns_once_in_flight_requests_have_finished(server):
    async def go() -> None:
        client = VLLMChatClient(base_url=server, api_key=KEY)
        async with httpx.AsyncClient() as http:
            tasks = [asyncio.create_task(complete(http, server, 400)) for _ in range(2)]
            await until(client, "running+queued", 2)
            assert (await client.pause("wait"))["in_flight"] >= 1  # one may have finished already
            await asyncio.sleep(0.05)  # the replies are on their way back
            assert all(t.done() for t in tasks)
            choices = [t.result() for t in tasks]
            await client.resume()
        assert [(c["finish_reason"], len(c["token_ids"])) for c in choices] == [("length", 400)] * 2
        await client.aclose()

    asyncio.run(go())


@pytest.mark.parametrize("backend", ["gloo", "shm"])  # shm: the pause and resume ride on start and finish
def test_a_publish_freezes_requests_in_flight_and_they_continue_on_the_new_weights(server, dirs, backend):
    """BroadcastPolicyPublisher pauses with mode=keep around the update (vLLM's async-RL recipe)."""
    old = AutoModelForCausalLM.from_pretrained(dirs[0])
    new = AutoModelForCausalLM.from_pretrained(dirs[1])
    client = VLLMChatClient(base_url=server, api_key=KEY, enable_weight_updates=True)
    publisher = BroadcastPolicyPublisher(client, timeout_s=30, backend=backend)
    assert publisher.pause_mode == "keep"
    first = {"gloo": 8, "shm": 10}[backend]  # one server for both: versions never go backwards
    publisher.publish(old.state_dict(), version=first)  # sets up the group first, so the next pause comes fast

    async def go() -> list[dict[str, Any]]:
        async with httpx.AsyncClient() as http:
            task = asyncio.create_task(complete(http, server, 1000))
            await until(client, "running", 1)
            await asyncio.to_thread(publisher.publish, new.state_dict(), first + 1)
            return [await task]

    choices = asyncio.run(go())
    publisher.close()
    assert not client.is_paused_sync()
    for c in choices:  # nothing lost: the frozen requests ran to their end, on two versions
        spans = c["weight_versions"]
        assert c["finish_reason"] in ("length", "stop")
        assert [s["version"] for s in spans] == [str(first), str(first + 1)]
        k, n = spans[0]["end"], len(c["token_ids"])
        assert 0 < k == spans[1]["start"] < n == spans[1]["end"]
        with torch.no_grad():  # the old weights' greedy log-probs (T=1) over the whole completion
            logps = torch.log_softmax(old(torch.tensor([PROMPT + c["token_ids"]])).logits.float(), -1)[0]
        old_logps = [float(logps[len(PROMPT) - 1 + i, t]) for i, t in enumerate(c["token_ids"])]
        served = c["logprobs"]["token_logprobs"]
        assert served[:k] == pytest.approx(old_logps[:k], abs=1e-4)  # before the freeze: the old policy
        assert served[k:] != pytest.approx(old_logps[k:], abs=1e-3)  # after it: the new one
