"""Request functions from datasets and queues, and a curriculum whose mix changes with the step."""

import asyncio
import json
import queue

import pytest

from ludic.inference import InferenceSpec, SamplingConfig
from ludic.training.batching import (
    Curriculum,
    GRPORequestStrategy,
    request_from_dict,
    request_to_dict,
    requests_from_dataset,
    requests_from_queue,
)
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest


def _req(x) -> RolloutRequest:
    return RolloutRequest(
        EnvSpec("qa", {"q": x}), ProtocolSpec("single"), env_seed=x if isinstance(x, int) else None
    )


def test_dataset_requests_cover_each_epoch_once_and_stop():
    fn = requests_from_dataset([1, 2, 3, 4], _req, batch_size=3, shuffle=True, seed=7, epochs=2)
    seen = [r.env.kwargs["q"] for _ in range(3) for r in fn()]
    assert sorted(seen[:4]) == [1, 2, 3, 4] and sorted(seen[4:]) == [1, 2, 3, 4]
    with pytest.raises(StopAsyncIteration):
        fn()


def test_dataset_shuffle_is_seeded():
    def order(seed):
        return [r.env.kwargs["q"] for r in requests_from_dataset(range(10), _req, batch_size=10, seed=seed)()]

    assert order(1) == order(1) and order(1) != order(2)
    assert [
        r.env.kwargs["q"] for r in requests_from_dataset(range(3), _req, batch_size=3, shuffle=False)()
    ] == [0, 1, 2]


def test_plain_iterables_are_consumed_in_order():
    fn = requests_from_dataset(iter(["a", "b", "c"]), _req, batch_size=2, epochs=1)
    assert [r.env.kwargs["q"] for r in fn()] == ["a", "b"]
    assert [r.env.kwargs["q"] for r in fn()] == ["c"]


async def test_queue_source_batches_and_ends_on_none():
    q: asyncio.Queue = asyncio.Queue()
    for x in [1, 2, 3, None]:
        q.put_nowait(None if x is None else _req(x))
    fn = requests_from_queue(q, batch_size=2)
    assert [r.env_seed for r in await fn()] == [1, 2]
    assert [r.env_seed for r in await fn()] == [3]
    with pytest.raises(StopAsyncIteration):
        await fn()


async def test_thread_queue_source_works_too():
    q: queue.Queue = queue.Queue()
    q.put(_req(5))
    fn = requests_from_queue(q, batch_size=1, timeout_s=1.0)
    assert [r.env_seed for r in await fn()] == [5]


async def test_curriculum_changes_the_mix_by_stage_and_tags_requests():
    easy = lambda: [_req("easy")]  # noqa: E731
    hard = lambda: [_req("hard")]  # noqa: E731
    schedule = Curriculum.staged([(0, {"easy": 1.0}), (3, {"hard": 1.0})])
    curriculum = Curriculum({"easy": easy, "hard": hard}, schedule, seed=0)
    picked = [(await curriculum())[0].meta["curriculum_source"] for _ in range(6)]
    assert picked == ["easy"] * 3 + ["hard"] * 3


async def test_curriculum_rejects_unknown_sources_and_bad_weights():
    with pytest.raises(KeyError, match="unknown sources"):
        await Curriculum({"a": lambda: []}, lambda step: {"b": 1.0})()
    with pytest.raises(ValueError, match="positive sum"):
        await Curriculum({"a": lambda: []}, lambda step: {"a": 0.0})()
    with pytest.raises(ValueError, match="step 0"):
        Curriculum.staged([(5, {"a": 1.0})])


def test_rollout_request_round_trips_through_json():
    request = RolloutRequest(
        EnvSpec("qa", {"q": "2+2"}), ProtocolSpec("single", {"k": 1}), env_seed=3, sampling_seed=4,
        inference=InferenceSpec(SamplingConfig(temperature=0.5, max_tokens=9, stop=["\n"])),
        num_episodes=2, meta={"group_id": "g"},
    )  # fmt: skip
    assert request_from_dict(json.loads(json.dumps(request_to_dict(request)))) == request


def test_grpo_expansion_shares_env_seed_varies_sampling_seed_and_sets_group_ids():
    out = GRPORequestStrategy(group_size=3).expand([_req(10), _req(20)])
    assert [r.env_seed for r in out] == [10, 10, 10, 20, 20, 20]
    assert len({r.sampling_seed for r in out}) == 6
    groups = [r.meta["group_id"] for r in out]
    assert groups[0] == groups[2] != groups[3] and all(r.meta["group_size"] == 3 for r in out)
    with pytest.raises(ValueError, match="num_episodes=1"):
        GRPORequestStrategy(group_size=2).expand(
            [RolloutRequest(EnvSpec("qa"), ProtocolSpec("s"), num_episodes=2)]
        )
