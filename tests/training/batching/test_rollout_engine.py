"""RolloutEngine: requests -> rollouts -> SAW batches, reproducibility and failure handling."""

import asyncio
import json

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.inference import SamplingConfig, TransformersChatClient
from ludic.inference.sampling import InferenceSpec
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing import tiny_model_path
from ludic.testing.scripted_client import ScriptedChatClient, fake_token_ids
from ludic.training.batching import (
    EpisodeFailuresError,
    GRPORequestStrategy,
    RolloutBatchSource,
    RolloutEngine,
)
from ludic.training.credit.assigners import EpisodicReturn, GroupNormalizedReturn
from ludic.training.filters import combine, drop_incomplete_completions, drop_parse_errors, drop_truncated
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest
from ludic.types import Rollout, Step, StepOutcome


class EchoEnv(SingleAgentEnv):
    """Reward 1 when the action equals the target letter; fails on purpose when asked to."""

    def __init__(self, target: str = "a", explode: bool = False) -> None:
        self.target, self.explode = target, explode

    def env_reset(self, *, seed=None):
        if self.explode:
            raise RuntimeError("env exploded on reset")
        return f"say {self.target}", {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(None, float(action == self.target), False, True, {"hit": action == self.target})

    def env_current_obs(self):
        return f"say {self.target}"


def _identity_parser(text: str) -> ParseResult:
    return ParseResult(action=text) if text != "?" else ParseResult(None, -0.5, "say one letter")


class _Algo:
    def __init__(self, assigner):
        self.credit_assigner = assigner
        self.preprocess = None
        self.name = "test"


def _engine(replies, **kwargs) -> RolloutEngine:
    client = ScriptedChatClient(replies)

    def protocol():
        return SingleAgentProtocol(
            agent=Agent(client=client, model="m", ctx=FullDialog(), parser=_identity_parser)
        )

    return RolloutEngine(env_registry={"echo": EchoEnv}, protocol_registry={"single": protocol}, **kwargs)


def _request(target="a", **kwargs) -> RolloutRequest:
    return RolloutRequest(EnvSpec("echo", {"target": target}), ProtocolSpec("single"), **kwargs)


async def test_generate_batch_builds_items_from_token_traces_with_meta():
    engine = _engine(["a", "b"])
    batch = await engine.generate_batch(
        [_request(meta={"tag": 1}, num_episodes=2)], _Algo(EpisodicReturn()), max_steps=3
    )
    assert [it.weight for it in batch.items] == [1.0, 0.0]
    item = batch.items[0]
    prompt_len = item.meta["prompt_length"]
    assert item.input_ids[prompt_len:] == fake_token_ids("a")
    assert item.action_mask == [0] * prompt_len + [1]
    assert item.attachments.actor_logps is not None and len(item.attachments.actor_logps.token_logps) == 1
    assert item.meta["request_meta"] == {"tag": 1} and item.meta["hit"] is True
    assert item.meta["step_index"] == 0 and item.meta["finish_reason"] == "stop"
    assert batch.meta["target_rollouts"] == 2 and batch.meta["effective_rollouts"] == 2
    assert batch.meta["avg_total_reward"] == 0.5 and batch.meta["failed_rollouts"] == 0


async def test_rollout_meta_records_request_episode_and_engine():
    engine = _engine(["a"] * 2)
    rollouts = await engine.generate_rollouts(
        requests=[_request(env_seed=5, sampling_seed=9, num_episodes=2)], max_steps=2
    )
    assert [r.meta["episode_idx"] for r in rollouts] == [0, 1]
    first = rollouts[0].meta["engine"]
    assert first == {
        "max_steps": 2,
        "env_kind": "echo",
        "protocol_kind": "single",
        "env_seed": 5,
        "sampling_seed": 9,
    }
    assert rollouts[1].meta["engine"]["sampling_seed"] != 9


async def test_unknown_kinds_raise_key_error_naming_the_kind():
    engine = _engine(["a"])
    with pytest.raises(KeyError, match="unknown env kind 'nope'"):
        await engine.generate_rollouts(
            requests=[RolloutRequest(EnvSpec("nope"), ProtocolSpec("single"))], max_steps=1
        )
    with pytest.raises(KeyError, match="unknown protocol kind 'zzz'"):
        await engine.generate_rollouts(
            requests=[RolloutRequest(EnvSpec("echo"), ProtocolSpec("zzz"))], max_steps=1
        )


async def test_failed_episode_is_recorded_counted_and_left_out_of_training(tmp_path):
    engine = _engine(["a"] * 4, jsonl_path=tmp_path / "rollouts.jsonl")
    requests = [
        _request(),
        _request(),
        RolloutRequest(EnvSpec("echo", {"explode": True}), ProtocolSpec("single")),
    ]
    batch = await engine.generate_batch(requests, _Algo(EpisodicReturn()), max_steps=1)
    assert batch.meta["failed_rollouts"] == 1 and len(batch.items) == 2
    records = [json.loads(line) for line in (tmp_path / "rollouts.jsonl").read_text().splitlines()]
    failed = [r for r in records if r["meta"].get("failed")]
    assert failed[0]["meta"]["error"] == {"type": "RuntimeError", "message": "env exploded on reset"}


async def test_too_many_failures_raise_with_the_first_error_chained():
    engine = _engine(["a"], max_failure_frac=0.5)
    bad = RolloutRequest(EnvSpec("echo", {"explode": True}), ProtocolSpec("single"), num_episodes=2)
    with pytest.raises(EpisodeFailuresError, match="2 of 3 episodes failed") as info:
        await engine.generate_rollouts(requests=[bad, _request()], max_steps=1)
    assert isinstance(info.value.__cause__, RuntimeError)


class _RunawayProtocol:
    """Ignores both max_steps and timeout_s: the engine must bound it anyway."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def run(self, *, env, max_steps, timeout_s=None, **_):
        if self.mode == "hang":
            await asyncio.sleep(60)
        steps = [Step(i, "o", "a", "o", 0.0, False, False) for i in range(max_steps + 1)]
        return [Rollout(steps=steps, meta={"agent_id": "agent_0"})]


async def test_protocols_over_max_steps_or_timeout_are_recorded_as_failed():
    engine = RolloutEngine(
        env_registry={"echo": EchoEnv},
        protocol_registry={"runaway": _RunawayProtocol},
        max_failure_frac=1.0,
    )
    requests = [
        RolloutRequest(EnvSpec("echo"), ProtocolSpec("runaway", {"mode": "long"})),
        RolloutRequest(EnvSpec("echo"), ProtocolSpec("runaway", {"mode": "hang"})),
    ]
    rollouts = await engine.generate_rollouts(
        requests=requests, max_steps=2, timeout_s=0.05, include_failed=True
    )
    assert [r.meta["failed"] for r in rollouts] == [True, True]
    assert rollouts[0].meta["error"] == {
        "type": "RuntimeError",
        "message": "protocol 'runaway' returned a rollout with 3 steps, max_steps=2",
    }
    assert rollouts[1].meta["error"]["type"] == "TimeoutError"


async def test_a_failed_episode_drops_its_whole_group_before_group_normalisation():
    calls = {"n": 0}

    def replies(request):
        calls["n"] += 1
        return "a" if calls["n"] % 2 else "b"

    engine = _engine(replies, max_failure_frac=0.9)
    grouped = GRPORequestStrategy(group_size=2).expand([_request("a"), _request("b")])
    broken = [
        grouped[0],
        grouped[1],
        grouped[2],
        RolloutRequest(EnvSpec("echo", {"explode": True}), ProtocolSpec("single"), meta=grouped[3].meta),
    ]
    batch = await engine.generate_batch(broken, _Algo(GroupNormalizedReturn(group_size=2)), max_steps=1)
    assert {it.meta["group_id"] for it in batch.items} == {grouped[0].meta["group_id"]}
    assert batch.meta["failed_rollouts"] == 1 and batch.meta["dropped_group_rollouts"] == 1


async def test_filters_drop_parse_errors_and_length_cut_completions():
    engine = _engine(["?", "a", ("a", "length")])
    algo = _Algo(EpisodicReturn())
    keep = combine(drop_parse_errors(), drop_incomplete_completions(), drop_truncated())
    batch = await engine.generate_batch([_request(num_episodes=1)], algo, keep, max_steps=2)
    # episode: "?" (parse error step) then "a" (success); the parse-error step is filtered out
    assert [it.meta["parse_error"] for it in batch.items] == [False]
    assert batch.meta["num_samples_before_filter"] == 2.0
    assert batch.meta["num_samples_filtered"] == 1.0
    assert batch.meta["num_samples"] == 1.0


async def test_without_a_filter_nothing_is_counted_as_filtered():
    batch = await _engine(["a", "b"]).generate_batch([_request(num_episodes=2)], _Algo(EpisodicReturn()), max_steps=1)
    assert (batch.meta["num_samples_before_filter"], batch.meta["num_samples_filtered"]) == (2.0, 0.0)


async def test_rollout_batch_source_expands_groups_and_sets_group_ids():
    engine = _engine(lambda req: "a")
    source = RolloutBatchSource(
        engine=engine,
        request_fn=lambda: [_request("a"), _request("b")],
        algorithm=_Algo(GroupNormalizedReturn(group_size=3)),
        max_steps=1,
        request_strategy=GRPORequestStrategy(group_size=3),
    )
    batch = await source.next_batch()
    assert len(batch.items) == 6 and batch.meta["target_rollouts"] == 6
    groups = [it.meta["group_id"] for it in batch.items]
    assert len(set(groups)) == 2 and all(groups.count(g) == 3 for g in groups)


async def test_same_requests_and_seeds_give_same_rollouts_on_the_embedded_engine():
    client = TransformersChatClient(tiny_model_path())

    def protocol():
        return SingleAgentProtocol(
            agent=Agent(client=client, model="tiny", ctx=FullDialog(), parser=_identity_parser)
        )

    engine = RolloutEngine(env_registry={"echo": EchoEnv}, protocol_registry={"single": protocol})
    spec = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=6))
    requests = GRPORequestStrategy(group_size=4).expand([_request(inference=spec, sampling_seed=3)])

    async def texts():
        rollouts = await engine.generate_rollouts(requests=requests, max_steps=1, concurrency=4)
        return [[s.trace.completion_token_ids for s in r.steps] for r in rollouts]

    first, second = await texts(), await texts()
    assert first == second
    assert len({tuple(t[0]) for t in first}) > 1  # different sampling seeds within the group
