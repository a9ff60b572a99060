"""Rollout requests are pure data (JSON round-trip); GRPO expansion makes groups that share an env seed."""

import json

import pytest

from ludic.inference import InferenceSpec, SamplingConfig
from ludic.training.batching import (
    GRPORequestStrategy,
    IdentityRequestStrategy,
    derive_seed,
    request_from_dict,
    request_to_dict,
)
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest


def _req(env_seed=None, sampling_seed=None, **meta) -> RolloutRequest:
    return RolloutRequest(
        EnvSpec("qa", {"q": "2+2"}), ProtocolSpec("single"), env_seed=env_seed, sampling_seed=sampling_seed,
        meta=meta,
    )  # fmt: skip


def _round_trip(request: RolloutRequest) -> RolloutRequest:
    return request_from_dict(json.loads(json.dumps(request_to_dict(request))))


def test_rollout_request_round_trips_through_json_with_inference_spec():
    request = RolloutRequest(
        EnvSpec("qa", {"q": "2+2", "n": [1, 2]}), ProtocolSpec("single", {"k": 1}), env_seed=3, sampling_seed=4,
        inference=InferenceSpec(SamplingConfig(temperature=0.5, max_tokens=9, stop=["\n"])),
        num_episodes=2, meta={"group_id": "g", "tags": {"a": 1}},
    )  # fmt: skip
    back = _round_trip(request)
    assert back == request
    assert back.inference.sampling.temperature == 0.5 and back.inference.sampling.stop == ("\n",)


def test_minimal_request_round_trips_and_missing_fields_are_named():
    request = RolloutRequest(EnvSpec("qa"), ProtocolSpec("single"))
    assert request_to_dict(request)["inference"] is None
    assert _round_trip(request) == request
    with pytest.raises(KeyError, match=r"lacks \['protocol'\]"):
        request_from_dict({"env": {"kind": "qa"}})


def test_grpo_expansion_shares_env_seed_varies_sampling_seed_and_sets_group_ids():
    out = GRPORequestStrategy(group_size=3).expand([_req(10, 1), _req(20, 2)])
    assert [r.env_seed for r in out] == [10, 10, 10, 20, 20, 20]
    assert [r.sampling_seed for r in out] == [3, 4, 5, 6, 7, 8]  # sampling_seed * group_size + i
    groups = [r.meta["group_id"] for r in out]
    assert groups[0] == groups[1] == groups[2] != groups[3] == groups[4] == groups[5]
    assert all(r.meta["group_size"] == 3 and r.num_episodes == 1 for r in out)


def test_grpo_without_seeds_derives_a_shared_env_seed_and_distinct_sampling_seeds():
    out = GRPORequestStrategy(group_size=4, seed=9).expand([_req(), _req()])
    assert len({r.env_seed for r in out[:4]}) == 1 and out[0].env_seed != out[4].env_seed
    assert len({r.sampling_seed for r in out}) == 8
    again = GRPORequestStrategy(group_size=4, seed=9).expand([_req(), _req()])
    assert [(r.env_seed, r.sampling_seed) for r in again] == [(r.env_seed, r.sampling_seed) for r in out]
    assert derive_seed("a", 1) == derive_seed("a", 1) != derive_seed("a", 2)


def test_grpo_keeps_a_given_group_id_and_copies_meta_per_member():
    out = GRPORequestStrategy(group_size=2).expand([_req(1, tags=["x"], group_id="mine")])
    assert [r.meta["group_id"] for r in out] == ["mine", "mine"]
    out[0].meta["tags"].append("y")
    assert out[1].meta["tags"] == ["x"]  # members do not share mutable meta


def test_grpo_rejects_multi_episode_requests_and_bad_group_sizes():
    with pytest.raises(ValueError, match="num_episodes=1, got 2"):
        GRPORequestStrategy(group_size=2).expand(
            [RolloutRequest(EnvSpec("qa"), ProtocolSpec("s"), num_episodes=2)]
        )
    with pytest.raises(ValueError, match="group_size must be an int >= 1, got 0"):
        GRPORequestStrategy(group_size=0)


def test_identity_strategy_plays_requests_as_given():
    requests = [_req(1), _req(2)]
    assert IdentityRequestStrategy().expand(requests) == requests
