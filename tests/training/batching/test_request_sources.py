"""Request functions from datasets and queues, and a curriculum whose mix changes with the step."""

import asyncio
import queue

import pytest

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import SingleAgentEnv
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import ParseResult
from ludic.testing.scripted_client import ScriptedChatClient
from ludic.training.algorithm import RLAlgorithm
from ludic.training.batching import (
    Curriculum,
    RolloutBatchSource,
    RolloutEngine,
    requests_from_dataset,
    requests_from_queue,
)
from ludic.training.credit.assigners import ConstantCredit
from ludic.training.loss import MaskedCausalLMCrossEntropyLoss
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest
from ludic.types import StepOutcome


def _req(x) -> RolloutRequest:
    return RolloutRequest(
        EnvSpec("qa", {"q": x}), ProtocolSpec("single"), env_seed=x if isinstance(x, int) else None
    )


def _qs(requests) -> list:
    return [r.env.kwargs["q"] for r in requests]


class _Rows:
    """A ``datasets.Dataset``-like table: ``__len__`` and ``__getitem__`` returning row dicts."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < self.n:
            raise IndexError(i)
        return {"question": f"q{i}"}


def test_dataset_requests_cover_each_epoch_once_and_stop():
    fn = requests_from_dataset([1, 2, 3, 4], _req, batch_size=3, shuffle=True, seed=7, epochs=2)
    seen = [q for _ in range(3) for q in _qs(fn())]
    assert sorted(seen[:4]) == [1, 2, 3, 4] and sorted(seen[4:]) == [1, 2, 3, 4]
    assert seen[:4] != seen[4:8]  # reshuffled between epochs
    with pytest.raises(StopAsyncIteration):
        fn()
    with pytest.raises(StopAsyncIteration):
        fn()


def test_dataset_shuffle_is_seeded_and_can_be_turned_off():
    def order(seed):
        return _qs(requests_from_dataset(list(range(10)), _req, batch_size=10, seed=seed)())

    assert order(1) == order(1) and order(1) != order(2)
    assert _qs(requests_from_dataset([0, 1, 2], _req, batch_size=3, shuffle=False)()) == [0, 1, 2]


def test_dataset_like_tables_pass_rows_to_make_request():
    fn = requests_from_dataset(
        _Rows(3), lambda row: _req(row["question"]), batch_size=2, shuffle=False, epochs=1
    )
    assert _qs(fn()) == ["q0", "q1"] and _qs(fn()) == ["q2"]
    with pytest.raises(StopAsyncIteration):
        fn()


def test_without_epochs_the_data_cycles_forever():
    fn = requests_from_dataset(["a", "b"], _req, batch_size=3, shuffle=False)
    assert [_qs(fn()) for _ in range(3)] == [["a", "b", "a"], ["b", "a", "b"], ["a", "b", "a"]]


def test_one_shot_iterators_give_one_pass_then_stop():
    fn = requests_from_dataset((x for x in "abc"), _req, batch_size=2)  # epochs=None
    assert _qs(fn()) == ["a", "b"] and _qs(fn()) == ["c"]
    with pytest.raises(StopAsyncIteration):
        fn()


def test_empty_data_and_bad_batch_size_are_clear_errors():
    with pytest.raises(ValueError, match="data is empty"):
        requests_from_dataset([], _req, batch_size=1)()
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        requests_from_dataset([1], _req, batch_size=0)


async def test_queue_source_batches_and_ends_on_none():
    q: asyncio.Queue = asyncio.Queue()
    for x in [1, 2, 3, None]:
        q.put_nowait(None if x is None else _req(x))
    fn = requests_from_queue(q, batch_size=2)
    assert [r.env_seed for r in await fn()] == [1, 2]
    assert [r.env_seed for r in await fn()] == [3]
    with pytest.raises(StopAsyncIteration):
        await fn()


async def test_queue_source_waits_for_a_producer():
    q: asyncio.Queue = asyncio.Queue()

    async def produce():
        for x in (1, 2):
            await asyncio.sleep(0.01)
            await q.put(_req(x))

    producer = asyncio.create_task(produce())
    assert [r.env_seed for r in await requests_from_queue(q, batch_size=2)()] == [1, 2]
    await producer


async def test_queue_timeout_returns_a_partial_batch_then_raises_when_empty():
    q: asyncio.Queue = asyncio.Queue()
    q.put_nowait(_req(1))
    fn = requests_from_queue(q, batch_size=3, timeout_s=0.02)
    assert [r.env_seed for r in await fn()] == [1]
    with pytest.raises(TimeoutError, match=r"no request arrived within 0\.02 s"):
        await fn()


async def test_thread_queue_source_works_too():
    q: queue.Queue = queue.Queue()
    q.put(_req(5))
    fn = requests_from_queue(q, batch_size=2, timeout_s=0.05)
    assert [r.env_seed for r in await fn()] == [5]  # partial: the second get timed out
    q.put(None)
    with pytest.raises(StopAsyncIteration):
        await fn()


async def test_curriculum_changes_the_mix_by_stage_and_tags_requests():
    easy = lambda: [_req("easy")]  # noqa: E731
    hard = lambda: [_req("hard")]  # noqa: E731
    curriculum = Curriculum([(0, {"easy": 1.0}), (3, {"hard": 1.0})], {"easy": easy, "hard": hard})
    picked = [(await curriculum())[0].meta["curriculum_source"] for _ in range(6)]
    assert picked == ["easy"] * 3 + ["hard"] * 3


async def test_curriculum_draws_by_weight_reproducibly_and_awaits_async_sources():
    async def hard():
        return [_req("hard")]

    def run(seed):
        curriculum = Curriculum(lambda step: {"easy": 3.0, "hard": 1.0}, {"easy": lambda: [_req("easy")], "hard": hard}, seed=seed)  # fmt: skip
        return [_qs(asyncio.run(curriculum()))[0] for _ in range(400)]

    picks = await asyncio.to_thread(run, 5)
    assert picks == await asyncio.to_thread(run, 5)
    assert 250 < picks.count("easy") < 350  # about 3/4


async def test_curriculum_drops_exhausted_sources_then_stops():
    easy = requests_from_dataset(["e1"], _req, batch_size=1, epochs=1)
    hard = requests_from_dataset(["h1", "h2"], _req, batch_size=1, shuffle=False, epochs=1)
    curriculum = Curriculum(
        Curriculum.staged([(0, {"easy": 1.0, "hard": 1.0})]), {"easy": easy, "hard": hard}
    )
    got = sorted([*_qs(await curriculum()), *_qs(await curriculum()), *_qs(await curriculum())])
    assert got == ["e1", "h1", "h2"]
    with pytest.raises(StopAsyncIteration):
        await curriculum()


async def test_curriculum_rejects_unknown_sources_bad_weights_and_swapped_arguments():
    with pytest.raises(KeyError, match="unknown sources"):
        await Curriculum(lambda step: {"b": 1.0}, {"a": lambda: []})()
    with pytest.raises(ValueError, match="positive sum"):
        await Curriculum(lambda step: {"a": 0.0}, {"a": lambda: []})()
    with pytest.raises(ValueError, match=r"starting at step 0, got starts \[5\]"):
        Curriculum([(5, {"a": 1.0})], {"a": lambda: []})
    with pytest.raises(TypeError, match="schedule first"):
        Curriculum({"a": lambda: []}, [(0, {"a": 1.0})])


class _EchoEnv(SingleAgentEnv):
    """One step: reward 1 when the action repeats the question."""

    def __init__(self, q: str) -> None:
        self.q = q

    def env_reset(self, *, seed=None):
        return self.q, {}

    def env_step(self, action: str) -> StepOutcome:
        return StepOutcome(None, float(action == self.q), False, True, {})

    def env_current_obs(self):
        return self.q


async def test_a_dataset_drives_rollout_batches_until_its_epochs_end():
    client = ScriptedChatClient(lambda request: request.messages[-1]["content"])  # echoes: reward 1
    engine = RolloutEngine(
        env_registry={"qa": _EchoEnv},
        protocol_registry={
            "single": lambda: SingleAgentProtocol(
                agent=Agent(client=client, model="m", ctx=FullDialog(), parser=ParseResult)
            )
        },
    )
    request_fn = requests_from_dataset(["x", "yy", "zzz"], _req, batch_size=2, shuffle=False, epochs=1)
    algo = RLAlgorithm("t", ConstantCredit(1.0), MaskedCausalLMCrossEntropyLoss(), None)
    source = RolloutBatchSource(engine=engine, request_fn=request_fn, algorithm=algo, max_steps=2)
    batches = [await source.next_batch(), await source.next_batch()]
    assert [b.meta["num_samples"] for b in batches] == [2.0, 1.0]
    assert [b.meta["avg_total_reward"] for b in batches] == [1.0, 1.0]
    assert [len(it.action_mask) - it.meta["prompt_length"] for it in batches[1].items] == [3]  # "zzz"
    with pytest.raises(StopAsyncIteration):
        await source.next_batch()
