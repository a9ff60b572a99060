"""Evaluator: fixed requests, decoding override, eval/ stats, reducers, JSONL + summary on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.eval import GREEDY, Evaluator
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.training.stats import Reducer
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest
from ludic.types import Rollout, Step, TokenTrace


class ScriptedEngine:
    """Stands in for RolloutEngine: one rollout per request with a scripted reward; the last ``fail``
    requests crash, each returned as one ``meta["failed"]`` rollout when ``include_failed`` (else dropped),
    as the engine does."""

    def __init__(self, rewards: list[float], fail: int = 0) -> None:
        self.rewards = rewards
        self.fail = fail
        self.calls: list[dict] = []

    async def generate_rollouts(self, *, requests, max_steps, concurrency, include_failed=False):
        self.calls.append({"requests": list(requests), "max_steps": max_steps, "concurrency": concurrency,
                           "include_failed": include_failed})  # fmt: skip
        rollouts = []
        if include_failed:
            for req in list(requests)[len(requests) - self.fail :]:
                error = {"type": "RuntimeError", "message": "crashed"}
                rollouts.append(Rollout(meta={"request_meta": req.meta, "failed": True, "error": error}))
        for req, reward in list(zip(requests, self.rewards))[: len(requests) - self.fail]:
            step = Step(
                index=0,
                prev_obs="Repeat a 2 times.",
                action="aa",
                next_obs=None,
                reward=reward,
                truncated=False,
                terminated=True,
                info={"correct": reward == 1.0, "parse_error": False, "finish_reason": "stop"},
                trace=TokenTrace(prompt_token_ids=[1, 2], completion_token_ids=[3, 4, 5]),
            )
            meta = {"request_meta": req.meta, "agent_id": "agent_0", "engine": {"env_seed": req.env_seed}}
            rollouts.append(Rollout(steps=[step], meta=meta))
        return rollouts


def _requests(n: int) -> list[RolloutRequest]:
    return [
        RolloutRequest(
            env=EnvSpec(kind="letter_repeat"),
            protocol=ProtocolSpec(kind="single_agent"),
            env_seed=100 + i,
            sampling_seed=i,
            inference=InferenceSpec(sampling=SamplingConfig(temperature=0.7)),
            meta={"i": i},
        )
        for i in range(n)
    ]


async def test_evaluate_returns_eval_prefixed_stats() -> None:
    engine = ScriptedEngine([1.0, 0.5, 0.0, 0.5])
    ev = Evaluator(engine=engine, requests=_requests(4), max_steps=3, concurrency=7)
    stats = await ev.evaluate()
    assert stats["eval/avg_total_reward"] == 0.5
    assert stats["eval/num_episodes"] == 4.0
    assert stats["eval/failed_rollouts"] == 0.0
    assert stats["eval/parse_error_rate"] == 0.0
    assert stats["eval/avg_completion_length"] == 3.0
    assert all(k.startswith("eval/") for k in stats)
    assert engine.calls[0]["max_steps"] == 3
    assert engine.calls[0]["concurrency"] == 7


async def test_concurrency_can_be_overridden_per_call() -> None:
    engine = ScriptedEngine([1.0])
    await Evaluator(engine=engine, requests=_requests(1), max_steps=1).evaluate(concurrency=2)
    assert engine.calls[0]["concurrency"] == 2


async def test_failed_rollouts_are_counted() -> None:
    engine = ScriptedEngine([1.0, 1.0, 1.0], fail=1)
    ev = Evaluator(engine=engine, requests=_requests(3), max_steps=1)
    stats = await ev.evaluate()
    assert engine.calls[0]["include_failed"] is True
    assert stats["eval/num_episodes"] == 2.0
    assert stats["eval/failed_rollouts"] == 1.0
    assert stats["eval/avg_total_reward"] == 1.0  # the failed episode is not averaged in as a reward of 0
    assert len(ev.last_rollouts) == 2 and [r.meta["error"]["message"] for r in ev.last_failed] == ["crashed"]


async def test_sampling_override_replaces_every_request_decoding_but_keeps_seeds() -> None:
    engine = ScriptedEngine([0.0, 0.0])
    await Evaluator(engine=engine, requests=_requests(2), max_steps=1, sampling=GREEDY).evaluate()
    sent = engine.calls[0]["requests"]
    assert [r.inference.sampling.temperature for r in sent] == [0.0, 0.0]
    assert [r.sampling_seed for r in sent] == [0, 1]
    assert [r.env_seed for r in sent] == [100, 101]


async def test_without_sampling_override_requests_are_untouched() -> None:
    engine = ScriptedEngine([0.0])
    await Evaluator(engine=engine, requests=_requests(1), max_steps=1).evaluate()
    assert engine.calls[0]["requests"][0].inference.sampling.temperature == 0.7


async def test_reducers_read_env_info_and_item_meta() -> None:
    reducers = {
        "accuracy": Reducer(kind="count_true", source="correct", normalize_by="rollouts"),
        "mean_reward": Reducer(kind="mean", source="reward"),
    }
    engine = ScriptedEngine([1.0, 0.5, 1.0, 0.0])
    stats = await Evaluator(engine=engine, requests=_requests(4), max_steps=1, reducers=reducers).evaluate()
    assert stats["eval/accuracy"] == 0.5
    assert stats["eval/mean_reward"] == 0.625


async def test_out_dir_gets_episode_jsonl_and_summary(tmp_path: Path) -> None:
    engine = ScriptedEngine([1.0, 0.0])
    ev = Evaluator(engine=engine, requests=_requests(2), max_steps=1, out_dir=tmp_path)
    await ev.evaluate(step=12)
    lines = (tmp_path / "eval_step_12.jsonl").read_text().splitlines()
    episodes = [json.loads(line) for line in lines]
    assert [e["total_reward"] for e in episodes] == [1.0, 0.0]
    assert [e["env_seed"] for e in episodes] == [100, 101]
    assert episodes[0]["steps"][0]["action"] == "aa"
    summary = json.loads((tmp_path / "eval_step_12_summary.json").read_text())
    assert summary["step"] == 12
    assert summary["eval/avg_total_reward"] == 0.5


def test_constructor_rejects_empty_requests_and_bad_numbers() -> None:
    engine = ScriptedEngine([])
    with pytest.raises(ValueError, match="requests is empty"):
        Evaluator(engine=engine, requests=[], max_steps=1)
    with pytest.raises(ValueError, match="max_steps must be >= 1, got 0"):
        Evaluator(engine=engine, requests=_requests(1), max_steps=0)
    with pytest.raises(ValueError, match="concurrency must be >= 1, got 0"):
        Evaluator(engine=engine, requests=_requests(1), max_steps=1, concurrency=0)
