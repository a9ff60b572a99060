"""MultiServerClient on two real Ludic servers (loopback, tiny model, bearer token): episodes spread over both,
each multi-turn episode on one server, a killed server's episodes replayed from their start on the other."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator

import pytest

from ludic.envs.tic_tac_toe import TicTacToeEnv
from ludic.inference.episode_key import current_episode_key, episode_scope
from ludic.inference.http_client import RequestRefused
from ludic.inference.multi_server import MultiServerClient, ServerDownError
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.registry.builtins import single_agent_protocol, xml_move_harness
from ludic.testing.server_process import start_servers, stop_server
from ludic.testing.tiny_model import tiny_model_path
from ludic.training import EnvSpec, ProtocolSpec, RolloutEngine, RolloutRequest
from ludic.training.batching.rollout_engine import EpisodeFailuresError
from ludic.training.presets import make_grpo

KEY = "test-token"
TURNS = 3  # the tiny model never writes <move>: every turn is a parse error, so each episode has 3 model calls


def _servers(n: int) -> tuple[list, list[str]]:
    return start_servers(tiny_model_path(), n, "--api-key", KEY)  # the model built here, once


@pytest.fixture(scope="module")
def two_servers() -> Iterator[list[str]]:
    procs, urls = _servers(2)
    try:
        yield urls
    finally:
        for p in procs:
            stop_server(p)


class RecordingClient(MultiServerClient):
    """The real client, remembering (episode key, server) of each completion it returned."""

    def __init__(self, *args, on_served=None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str | None, str]] = []
        self.on_served = on_served

    async def complete(self, request):
        response, info = await super().complete(request)
        self.calls.append((current_episode_key(), info["server"]))
        if self.on_served is not None:
            self.on_served(self)
        return response, info


def _engine(client: MultiServerClient, *, retries: int = 0) -> RolloutEngine:
    sampling = SamplingConfig(temperature=1.0, max_tokens=8)

    def protocol(**kwargs):
        agent = xml_move_harness(client=client, model="tiny", tokenizer=_tokenizer(), sampling=sampling)
        return single_agent_protocol(agent=agent, **kwargs)

    return RolloutEngine(
        env_registry={"ttt": TicTacToeEnv}, protocol_registry={"p": protocol}, episode_retries=retries
    )


_TOK: list = []


def _tokenizer():
    if not _TOK:
        from transformers import AutoTokenizer

        _TOK.append(AutoTokenizer.from_pretrained(tiny_model_path()))
    return _TOK[0]


def _requests(n: int, group: int = 2) -> list[RolloutRequest]:
    spec = InferenceSpec(sampling=SamplingConfig(temperature=1.0, max_tokens=8))
    return [
        RolloutRequest(EnvSpec("ttt"), ProtocolSpec("p"), env_seed=i, sampling_seed=i, inference=spec,
                       num_episodes=group, meta={"group_id": f"g{i}"})
        for i in range(n)
    ]  # fmt: skip


def _by_episode(calls: list[tuple[str | None, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for key, server in calls:
        assert key is not None, "a call made inside the rollout engine has no episode key"
        out[key].append(server)
    return out


def test_episodes_spread_over_both_servers_and_each_episode_stays_on_one(two_servers) -> None:
    client = RecordingClient(two_servers, api_key=KEY)
    rollouts = asyncio.run(_engine(client).generate_rollouts(requests=_requests(4), max_steps=TURNS, concurrency=8))
    episodes = _by_episode(client.calls)
    assert len(rollouts) == 8 and len(episodes) == 8
    assert all(len(r.steps) == TURNS for r in rollouts)
    assert all(len(servers) == TURNS and len(set(servers)) == 1 for servers in episodes.values())
    per_server = {u: sum(s[0] == u for s in episodes.values()) for u in two_servers}
    assert all(n >= 2 for n in per_server.values()), per_server
    assert client.served == [sum(s == u for _, s in client.calls) for u in two_servers]


def test_calls_outside_an_episode_alternate_between_idle_servers(two_servers) -> None:
    client = MultiServerClient(two_servers, api_key=KEY)
    request = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                    sampling=SamplingConfig(max_tokens=2))  # fmt: skip

    async def four() -> list[str]:
        return [(await client.complete(request))[1]["server"] for _ in range(4)]

    servers = asyncio.run(four())
    assert sorted(servers) == sorted(two_servers * 2)
    assert servers[0] != servers[1] and servers[2] != servers[3]


def test_a_refused_token_propagates_and_marks_no_server_down(two_servers) -> None:
    client = MultiServerClient(two_servers, api_key="wrong")
    request = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                    sampling=SamplingConfig(max_tokens=2))  # fmt: skip
    with pytest.raises(RequestRefused, match="401"):
        asyncio.run(client.complete(request))
    assert all(client.is_up(i) for i in range(2))


def test_policy_version_is_the_minimum_over_servers(two_servers) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    client = MultiServerClient(two_servers, api_key=KEY, enable_weight_updates=True)
    params = AutoModelForCausalLM.from_pretrained(tiny_model_path(), dtype=torch.float32).state_dict()
    first = client.clients[0]
    before = asyncio.run(client.get_policy_version())
    first.sync_weights(params, version=before + 5)  # only the first server moves on
    assert asyncio.run(first.get_policy_version()) == before + 5
    assert asyncio.run(client.get_policy_version()) == before  # the other still serves `before`
    client.sync_weights(params, version=before + 5)
    assert asyncio.run(client.get_policy_version()) == before + 5


def test_a_dead_server_is_left_out_and_named() -> None:
    procs, urls = _servers(2)
    try:
        stop_server(procs[0])
        client = MultiServerClient(urls, api_key=KEY, cooloff_s=60, retries=0)
        request = ChatCompletionRequest(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                        sampling=SamplingConfig(max_tokens=2))  # fmt: skip

        async def scenario() -> str:
            with episode_scope("e1"), pytest.raises(ServerDownError) as info:
                await client.complete(request)  # the first pick (both idle) is the first server
            assert info.value.server == urls[0]
            assert urls[0] in str(info.value) and "left out for 60 s" in str(info.value)
            with episode_scope("e2"):
                return (await client.complete(request))[1]["server"]

        assert asyncio.run(scenario()) == urls[1]
        assert not client.is_up(0) and client.is_up(1)
        assert asyncio.run(client.get_policy_version()) >= 0  # the dead one is skipped, not an error
    finally:
        for p in procs:
            stop_server(p)


def test_episodes_begun_on_a_dead_server_are_replayed_from_the_start_on_a_live_one(two_servers) -> None:
    from ludic.inference.weight_sync.process_group import free_port

    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: the first pick goes to it
    client = RecordingClient([dead, two_servers[0]], api_key=KEY, retries=0)
    batch = asyncio.run(_engine(client, retries=1).generate_batch(_requests(2), make_grpo(group_size=2),
                                                                   max_steps=TURNS, concurrency=4))  # fmt: skip
    assert batch.meta["episode_retries"] >= 1 and batch.meta["failed_rollouts"] == 0
    assert {s for _, s in client.calls} == {two_servers[0]}
    assert len(_by_episode(client.calls)) == 4  # the lost attempts made no completion
    assert len(batch.items) == 4 * TURNS


@pytest.mark.slow
def test_a_server_killed_mid_run_its_episodes_are_replayed_whole_on_the_other() -> None:
    procs, urls = _servers(2)
    killed: list[int] = []

    def kill_first_after_two_calls(client: RecordingClient) -> None:
        if not killed and sum(s == urls[0] for _, s in client.calls) >= 2:
            procs[0].kill()  # SIGKILL: its open requests are reset, new ones refused
            procs[0].wait()
            killed.append(len(client.calls))
            killed.append(client.in_flight[0])

    try:
        client = RecordingClient(urls, api_key=KEY, retries=0, on_served=kill_first_after_two_calls)
        batch = asyncio.run(_engine(client, retries=2).generate_batch(_requests(4), make_grpo(group_size=2),
                                                                       max_steps=TURNS, concurrency=8))  # fmt: skip
    finally:
        for p in procs:
            stop_server(p)
    assert killed, "the first server never served two calls"
    assert batch.meta["episode_retries"] >= 1  # an episode begun there was replayed
    assert batch.meta["failed_rollouts"] == 0
    # every trained rollout is whole: steps 0..TURNS-1, the last one cut at max_steps
    steps: dict[str, list] = defaultdict(list)
    for item in batch.items:
        steps[item.meta["rollout_id"]].append(item.meta)
    assert len(steps) == 8
    for metas in steps.values():
        assert sorted(m["step_index"] for m in metas) == list(range(TURNS))
        assert next(m for m in metas if m["step_index"] == TURNS - 1)["truncated"] is True
    # after the kill, only replies already on their way came from the dead server
    assert sum(s == urls[0] for _, s in client.calls[killed[0]:]) <= killed[1]


@pytest.mark.slow
def test_without_retries_an_episode_that_lost_its_server_is_counted_failed_not_trained() -> None:
    procs, urls = _servers(2)
    try:
        stop_server(procs[0])
        client = MultiServerClient(urls, api_key=KEY, retries=0)
        engine = _engine(client, retries=0)
        engine.max_failure_frac = 1.0
        batch = asyncio.run(engine.generate_batch(_requests(2), make_grpo(group_size=2), max_steps=TURNS))
        assert batch.meta["failed_rollouts"] >= 1
        ids = {it.meta["rollout_id"] for it in batch.items}
        assert all(sum(it.meta["rollout_id"] == r for it in batch.items) == TURNS for r in ids)
        engine.max_failure_frac = 0.0
        with pytest.raises(EpisodeFailuresError, match=urls[0].split("//")[1]):
            client.down_until = [0.0, 0.0]
            asyncio.run(engine.generate_batch(_requests(2), make_grpo(group_size=2), max_steps=TURNS))
    finally:
        for p in procs:
            stop_server(p)


def test_a_server_down_error_wrapped_by_a_protocol_still_marks_the_episode_for_replay() -> None:
    from ludic.inference.multi_server import server_went_down

    def wrapped() -> RuntimeError:
        try:
            raise ServerDownError("server http://10.0.0.5:8000 failed", "http://10.0.0.5:8000")
        except ServerDownError as exc:
            try:
                raise RuntimeError("the program's call failed") from exc
            except RuntimeError as outer:
                return outer

    assert server_went_down(wrapped())
    assert not server_went_down(RuntimeError("a bug in the env"))
    assert not server_went_down(None)
