"""Agent programs on the real ``openai`` SDK against Ludic's server (a subprocess on loopback), as episodes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from pathlib import Path
from typing import Any

import pytest
import torch

openai = pytest.importorskip("openai")

from ludic.envs.letter_repeat import LetterRepeatEnv  # noqa: E402
from ludic.inference.call_recorder import EPISODE  # noqa: E402
from ludic.interaction.openai_program import OpenAIProgramProtocol, ProgramTask  # noqa: E402
from ludic.training.algorithm import RLAlgorithm  # noqa: E402
from ludic.training.batching.rollout_engine import RolloutEngine  # noqa: E402
from ludic.training.credit.assigners import EpisodicReturn  # noqa: E402
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest  # noqa: E402

pytestmark = pytest.mark.integration
TEMPERATURE = 0.8
MAX_TOKENS = 6


async def draft_then_revise(client: Any, task: ProgramTask, seen: list[Any] | None = None) -> str:
    """The issue's two-call program: a draft, then a revision of it in the same conversation."""
    messages = [{"role": "user", "content": task.prompt}]
    first = await client.chat.completions.create(
        model=task.model, messages=messages, max_tokens=MAX_TOKENS, temperature=TEMPERATURE
    )
    messages += [
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "Revise your answer."},
    ]
    second = await client.chat.completions.create(
        model=task.model, messages=messages, max_tokens=MAX_TOKENS, temperature=TEMPERATURE
    )
    if seen is not None:
        seen += [first, second]
    return second.choices[0].message.content


def sync_draft_then_revise(client: Any, task: ProgramTask) -> str:
    messages = [{"role": "user", "content": task.prompt}]
    first = client.chat.completions.create(model=task.model, messages=messages, max_tokens=MAX_TOKENS)
    messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Again."}]
    return client.chat.completions.create(model=task.model, messages=messages, max_tokens=MAX_TOKENS).choices[0].message.content


def make_engine(base_url: str) -> RolloutEngine:
    def protocol(program: Any, **kwargs: Any) -> OpenAIProgramProtocol:
        return OpenAIProgramProtocol(program, base_url=base_url, **kwargs)

    return RolloutEngine(env_registry={"letter_repeat": LetterRepeatEnv}, protocol_registry={"program": protocol},
                         max_failure_frac=1.0, one_sequence=True)  # fmt: skip


def make_request(program: Any, seed: int = 0, episodes: int = 1, **kwargs: Any) -> RolloutRequest:
    spec = ProtocolSpec("program", {"program": program, **kwargs})
    return RolloutRequest(env=EnvSpec("letter_repeat"), protocol=spec, env_seed=seed, sampling_seed=seed,
                          num_episodes=episodes, meta={"program": getattr(program, "__name__", "")})  # fmt: skip


ALGORITHM = RLAlgorithm(name="episodic", credit_assigner=EpisodicReturn(), loss=None)  # type: ignore[arg-type]


def score(answer: str, seed: int) -> float:
    env = LetterRepeatEnv()
    env.reset(seed=seed)
    return env.env_step(answer).reward


async def test_two_call_program_records_the_ids_and_logprobs_the_server_returned(base_url: str) -> None:
    seen: list[Any] = []
    protocol = OpenAIProgramProtocol(functools.partial(draft_then_revise, seen=seen), base_url=base_url)
    [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=4, env_seed=3, sampling_seed=3)
    assert [s.index for s in rollout.steps] == [0, 1]
    for step, response in zip(rollout.steps, seen, strict=True):
        choice = response.choices[0]
        assert step.trace.prompt_token_ids == response.model_extra["prompt_token_ids"]
        assert step.trace.completion_token_ids == choice.model_extra["token_ids"]
        assert step.trace.completion_logprobs == [e.logprob for e in choice.logprobs.content]
        assert step.action == choice.message.content
        assert (step.info["sampling_temperature"], step.info["policy_version"]) == (TEMPERATURE, 0)
        assert "sequence_break" not in step.info
    first, second = rollout.steps
    head = [*first.trace.prompt_token_ids, *first.trace.completion_token_ids]
    assert second.trace.prompt_token_ids[: len(head)] == head  # the draft's ids verbatim, not re-tokenised
    assert (first.reward, second.terminated) == (0.0, True)
    assert second.reward == score(second.action, 3)


async def test_reply_sent_back_as_text_is_re_tokenised_and_the_step_says_why(base_url: str) -> None:
    protocol = OpenAIProgramProtocol(draft_then_revise, base_url=base_url, attach_token_ids=False)
    [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=4, env_seed=3, sampling_seed=3)
    assert "previous call's prompt + completion ids" in rollout.steps[1].info["sequence_break"]


async def test_concurrent_programs_each_train_as_one_exact_sequence(base_url: str, model_dir: Path) -> None:
    requests = [make_request(draft_then_revise, seed=5, episodes=3), make_request(sync_draft_then_revise, seed=6)]
    batch = await make_engine(base_url).generate_batch(requests, ALGORITHM, concurrency=4)
    assert batch.meta["failed_rollouts"] == 0.0
    assert len(batch.items) == 4  # one item per episode, not one per call
    for item in batch.items:
        assert (item.meta["num_calls"], item.meta["one_sequence"]) == (2, True)
        spans = [n for bit, n in _runs(item.action_mask) if bit == 1]
        assert len(spans) == 2 and item.action_mask[0] == 0  # the two replies, the revision prompt between
        assert sum(spans) == len(item.attachments.actor_logps.token_logps)
    _check_logps(batch.items[0], model_dir, TEMPERATURE)
    _check_logps(batch.items[3], model_dir, 1.0)  # the sync program asked for no temperature: 1.0


def _runs(mask: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for bit in mask:
        runs[-1:] = [(bit, runs[-1][1] + 1)] if runs and runs[-1][0] == bit else [*runs[-1:], (bit, 1)]
    return runs


def _check_logps(item: Any, model_dir: Path, temperature: float) -> None:
    """The recorded log-probs are the model's at the sampling temperature, on the merged sequence."""
    from transformers import AutoModelForCausalLM

    assert item.meta["sampling_temperature"] == temperature
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([item.input_ids])).logits[0, :-1].float()
    logps = torch.log_softmax(logits / temperature, -1)
    recomputed = [logps[i - 1, item.input_ids[i]].item() for i, bit in enumerate(item.action_mask) if bit]
    assert recomputed == pytest.approx(item.attachments.actor_logps.token_logps, abs=2e-3)


async def raises(client: Any, task: ProgramTask) -> str:
    await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": task.prompt}], max_tokens=2)
    raise RuntimeError("program bug")


async def hangs(client: Any, task: ProgramTask) -> str:
    await asyncio.sleep(3600)
    return "never"


async def makes_no_call(client: Any, task: ProgramTask) -> str:
    return "aaaa"


async def leaves_a_call_in_flight(client: Any, task: ProgramTask) -> str:
    messages = [{"role": "user", "content": task.prompt}]
    await client.chat.completions.create(model=task.model, messages=messages, max_tokens=2)
    task_ref = asyncio.ensure_future(client.chat.completions.create(model=task.model, messages=messages, max_tokens=50))
    task_ref.add_done_callback(lambda t: t.cancelled() or t.exception())  # it fails once the client closes
    # return as soon as the call has gone out: a fixed sleep let a fast CPU's server answer all 50 tokens first
    # (the episode then held two whole calls). The reply cannot be read before this loop's next turn sees the
    # count: a turn's I/O callbacks run after the ones already queued, and sleep(0) queues this coroutine first.
    recorder = EPISODE.get()
    while recorder.in_flight == 0 and not task_ref.done():
        await asyncio.sleep(0)
    leaves_a_call_in_flight.pending = task_ref  # type: ignore[attr-defined]  (kept alive, not awaited)
    return "aaaa"


async def swallows_a_refused_call(client: Any, task: ProgramTask) -> str:
    messages = [{"role": "user", "content": task.prompt}]
    await client.chat.completions.create(model=task.model, messages=messages, max_tokens=2)
    with contextlib.suppress(openai.BadRequestError):  # the program carries on without that reply
        await client.chat.completions.create(model=task.model, messages=messages, max_tokens=2, top_p=5.0)
    return "aaaa"


async def test_failing_programs_are_counted_failures_and_never_trained(base_url: str) -> None:
    bad = [raises, hangs, makes_no_call, leaves_a_call_in_flight, swallows_a_refused_call]
    requests = [make_request(p, seed=i) for i, p in enumerate(bad)] + [make_request(draft_then_revise, seed=9)]
    engine = make_engine(base_url)
    rollouts = await engine.generate_rollouts(requests=requests, max_steps=4, timeout_s=3.0, include_failed=True)
    errors = {r.meta["request_meta"]["program"]: r.meta.get("error", {}).get("message", "") for r in rollouts}
    assert "program bug" in errors["raises"]
    assert "Timeout" in errors["hangs"]  # the engine's own timeout (same deadline) may fire first
    assert "no chat completion call" in errors["makes_no_call"]
    assert "still in flight" in errors["leaves_a_call_in_flight"]
    assert "HTTP 400" in errors["swallows_a_refused_call"]
    assert errors["draft_then_revise"] == ""
    batch = await engine.generate_batch(requests, ALGORITHM, timeout_s=3.0)
    assert batch.meta["failed_rollouts"] == 5.0
    assert [it.meta["request_meta"]["program"] for it in batch.items] == ["draft_then_revise"]


async def test_calls_past_max_steps_fail_the_episode(base_url: str) -> None:
    async def three_calls(client: Any, task: ProgramTask) -> str:
        for _ in range(3):
            await client.chat.completions.create(model=task.model, messages=[{"role": "user", "content": "x"}], max_tokens=1)
        return "a"

    with pytest.raises(Exception, match="more than 2 model calls"):
        await OpenAIProgramProtocol(three_calls, base_url=base_url).run(env=LetterRepeatEnv(), max_steps=2, env_seed=0)
