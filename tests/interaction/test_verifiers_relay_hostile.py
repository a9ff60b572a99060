"""The verifiers call relay against hostile harness programs, in front of Ludic's real server (a subprocess on
loopback): a malformed call is a 4xx refusal of its own run (named), and an episode cannot open runs without
bound (each run has its own call budget and recorder)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ludic.interaction.verifiers_calls import SESSION_HEADER, CallRelay

pytestmark = pytest.mark.integration
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


async def _post(relay: CallRelay, session: str, **kwargs: Any) -> httpx.Response:
    headers = {SESSION_HEADER: session, **kwargs.pop("headers", {})}
    async with httpx.AsyncClient(timeout=60) as http:
        return await http.post(f"{relay.base_url}/chat/completions", headers=headers, **kwargs)


async def test_an_episode_opens_at_most_max_sessions_runs(base_url: str) -> None:
    relay = CallRelay(base_url)
    relay.max_sessions = 2  # (default 256)
    async with relay:
        for run in ("run-a", "run-b"):
            assert (await _post(relay, run, json=CHAT)).status_code == 200
        refused = await _post(relay, "run-c", json=CHAT)  # was: a third recorder with a fresh call budget
        assert refused.status_code == 429
        assert "more than 2 agent runs" in refused.json()["error"]["message"]
        assert "run-c" not in relay.recorders
        assert relay.errors == [refused.json()["error"]["message"]]
        assert (await _post(relay, "run-a", json=CHAT)).status_code == 200  # known runs carry on


@pytest.mark.parametrize(
    ("content", "named"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "a JSON list, not an object"),
        (b'{"messages": [], "stream": true, "stream_options": true}', "stream_options must be a JSON object"),
    ],
)
async def test_a_malformed_call_is_a_named_400_that_fails_its_run(base_url: str, content: bytes, named: str) -> None:
    async with CallRelay(base_url) as relay:
        response = await _post(relay, "run-a", content=content, headers={"Content-Type": "application/json"})
        assert response.status_code == 400 and named in response.json()["error"]["message"]  # was: a 500
        assert any(named in p for p in relay.problems("run-a"))


async def test_a_run_refused_by_the_relay_fails_the_episode(base_url: str) -> None:
    vf = pytest.importorskip("verifiers.v1")
    from ludic.interaction.verifiers_episode import VerifiersEpisodeFailed, episode_rollouts

    relay = CallRelay(base_url)
    relay.max_sessions = 0
    async with relay:
        assert (await _post(relay, "run-a", json=CHAT)).status_code == 429
    episode = vf.Episode(task=vf.TraceTask(type="EchoTask", data=vf.TaskData(prompt="hi")), ok=True)
    with pytest.raises(VerifiersEpisodeFailed, match="a model call was refused: more than 0 agent runs"):
        episode_rollouts(episode, relay)
