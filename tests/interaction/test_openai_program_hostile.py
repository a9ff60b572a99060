"""Hostile and careless agent programs on the real ``openai`` SDK against Ludic's server (a subprocess on
loopback): each bad call fails only its own episode, with an error naming what was wrong, and never
lands in another episode's recording."""

from __future__ import annotations

import asyncio
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from ludic.envs.letter_repeat import LetterRepeatEnv  # noqa: E402
from ludic.inference import call_recorder  # noqa: E402
from ludic.inference.sampling import InferenceSpec, SamplingConfig  # noqa: E402
from ludic.interaction.openai_program import OpenAIProgramProtocol, ProgramFailed, ProgramTask  # noqa: E402
from ludic.testing import build_tiny_model  # noqa: E402
from ludic.testing.server_process import running_server  # noqa: E402

pytestmark = pytest.mark.integration


def _ask(task: ProgramTask, **kwargs: Any) -> dict[str, Any]:
    return {"model": task.model, "messages": [{"role": "user", "content": task.prompt}], "max_tokens": 2, **kwargs}


async def test_a_client_borrowed_from_a_concurrent_episode_fails_only_the_borrower(base_url: str) -> None:
    kept: dict[str, Any] = {}
    borrowed = asyncio.Event()

    async def lends(client: Any, task: ProgramTask) -> str:
        kept["client"] = client
        reply = await client.chat.completions.create(**_ask(task))
        await asyncio.wait_for(borrowed.wait(), 30)  # still running while the other episode borrows
        return reply.choices[0].message.content

    async def borrows(client: Any, task: ProgramTask) -> str:
        while "client" not in kept:
            await asyncio.sleep(0.01)
        try:
            reply = await kept["client"].chat.completions.create(**_ask(task))
        finally:
            borrowed.set()
        return reply.choices[0].message.content

    lender, borrower = await asyncio.gather(
        OpenAIProgramProtocol(lends, base_url=base_url).run(env=LetterRepeatEnv(), max_steps=4, env_seed=0),
        OpenAIProgramProtocol(borrows, base_url=base_url).run(env=LetterRepeatEnv(), max_steps=4, env_seed=1),
        return_exceptions=True,
    )
    [rollout] = lender
    assert len(rollout.steps) == 1  # the borrowed call is not recorded as the lender's
    assert isinstance(borrower, ProgramFailed) and "another episode's client" in str(borrower)


async def test_a_client_kept_after_its_episode_ended_names_the_refusal(base_url: str) -> None:
    kept: list[Any] = []

    async def keeps(client: Any, task: ProgramTask) -> str:
        kept.append(client)
        return (await client.chat.completions.create(**_ask(task))).choices[0].message.content

    async def reuses(client: Any, task: ProgramTask) -> str:
        return (await kept[0].chat.completions.create(**_ask(task))).choices[0].message.content

    await OpenAIProgramProtocol(keeps, base_url=base_url).run(env=LetterRepeatEnv(), max_steps=2, env_seed=0)
    with pytest.raises(ProgramFailed, match="client has been closed"):  # was: only "Connection error."
        await OpenAIProgramProtocol(reuses, base_url=base_url).run(env=LetterRepeatEnv(), max_steps=2, env_seed=0)


async def test_fields_sent_as_null_take_the_runs_settings_and_are_recorded_as_sampled(base_url: str) -> None:
    async def nulls(client: Any, task: ProgramTask) -> str:  # the SDK sends None as JSON null
        reply = await client.chat.completions.create(**_ask(task, temperature=None, top_p=None, n=None, seed=11))
        return reply.choices[0].message.content

    inference = InferenceSpec(sampling=SamplingConfig(temperature=0.5, max_tokens=2))
    protocol = OpenAIProgramProtocol(nulls, base_url=base_url)
    [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=2, env_seed=0, inference=inference)
    [step] = rollout.steps  # was: a failed episode ("float() argument must be ... not 'NoneType'")
    assert (step.info["sampling_temperature"], step.info["sampling_top_p"]) == (0.5, 1.0)
    direct = await openai.AsyncOpenAI(base_url=base_url, api_key="-").chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": step.prev_obs}], max_tokens=2, temperature=0.5,
        seed=11, logprobs=True, extra_body={"return_token_ids": True},
    )  # fmt: skip
    assert step.trace.completion_token_ids == direct.choices[0].model_extra["token_ids"]  # sampled at 0.5
    assert step.trace.completion_logprobs == pytest.approx([e.logprob for e in direct.choices[0].logprobs.content], abs=1e-4)


async def test_assistant_content_parts_get_the_servers_named_refusal(base_url: str) -> None:
    async def parts(client: Any, task: ProgramTask) -> str:
        first = await client.chat.completions.create(**_ask(task))
        reply = [{"type": "text", "text": first.choices[0].message.content}]
        messages = [*_ask(task)["messages"], {"role": "assistant", "content": reply}, {"role": "user", "content": "Again."}]
        again = await client.chat.completions.create(model=task.model, messages=messages, max_tokens=2)
        return again.choices[0].message.content

    with pytest.raises(ProgramFailed, match=r"HTTP 400.*messages\[1\]\['content'\] must be a str"):
        await OpenAIProgramProtocol(parts, base_url=base_url).run(env=LetterRepeatEnv(), max_steps=4, env_seed=0)


def test_refused_calls_are_counted_but_kept_only_up_to_a_bound(base_url: str) -> None:
    recorder = call_recorder.CallRecorder(max_calls=4)
    recorder.seal()  # an abandoned thread calling after its episode ended, in a loop
    http = httpx.Client(transport=call_recorder.RecordingTransport(recorder))
    client = openai.OpenAI(base_url=base_url, api_key="-", max_retries=0, http_client=http)
    for _ in range(300):
        with pytest.raises(openai.APIConnectionError):
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=1)
    assert len(recorder.errors) == 8  # was: all 300 kept
    assert (recorder.error_count, call_recorder.MAX_KEPT_ERRORS) == (300, 8)
    assert recorder.errors[0].startswith("call after the episode ended")


async def test_sync_programs_hung_past_their_timeout_do_not_starve_later_episodes(base_url: str) -> None:
    release = threading.Event()

    def hangs(client: Any, task: ProgramTask) -> str:
        release.wait(60)
        return "a"

    def answers(client: Any, task: ProgramTask) -> str:
        return client.chat.completions.create(**_ask(task)).choices[0].message.content

    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=2))  # a small host's pool
    try:
        for seed in range(2):
            with pytest.raises(ProgramFailed, match=r"timeout_s=0\.3"):
                await OpenAIProgramProtocol(hangs, base_url=base_url, timeout_s=0.3).run(
                    env=LetterRepeatEnv(), max_steps=2, env_seed=seed
                )
        protocol = OpenAIProgramProtocol(answers, base_url=base_url, timeout_s=8.0)
        [rollout] = await protocol.run(env=LetterRepeatEnv(), max_steps=2, env_seed=0)  # was: queued, timed out
        assert len(rollout.steps) == 1
    finally:
        release.set()


@pytest.mark.parametrize("sync", [False, True])
async def test_a_program_calling_sys_exit_fails_only_its_episode(base_url: str, sync: bool) -> None:
    async def exits(client: Any, task: ProgramTask) -> str:
        await client.chat.completions.create(**_ask(task))
        sys.exit(3)

    def sync_exits(client: Any, task: ProgramTask) -> str:
        client.chat.completions.create(**_ask(task))
        sys.exit(3)

    protocol = OpenAIProgramProtocol(sync_exits if sync else exits, base_url=base_url)
    with pytest.raises(ProgramFailed, match=r"program called sys.exit\(3\)"):  # was: SystemExit ended the run
        await protocol.run(env=LetterRepeatEnv(), max_steps=2, env_seed=0)


async def test_past_max_abandoned_threads_new_sync_programs_are_refused_by_name(
    base_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ludic.interaction import openai_program

    release = threading.Event()

    def hangs(client: Any, task: ProgramTask) -> str:
        release.wait(60)
        return "a"

    for thread in list(openai_program._ABANDONED):  # earlier tests' released programs end first
        thread.join(10)
    monkeypatch.setattr(openai_program, "MAX_ABANDONED_THREADS", 1)
    try:
        for _ in range(2):  # the first hangs and is abandoned; the second is refused before it starts
            with pytest.raises(ProgramFailed) as failed:
                await OpenAIProgramProtocol(hangs, base_url=base_url, timeout_s=0.3).run(
                    env=LetterRepeatEnv(), max_steps=2, env_seed=0
                )
        assert "abandoned past their timeout are still running" in str(failed.value)
    finally:
        release.set()


@pytest.fixture(scope="module")
def judge_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Another model server (different weights): a judge the program asks, which is not the policy."""
    with running_server(build_tiny_model(tmp_path_factory.mktemp("judge"), seed=7)) as url:
        yield url + "/v1"


async def test_a_call_to_another_server_through_the_client_is_not_recorded_as_the_policys(
    base_url: str, judge_url: str
) -> None:
    async def asks_a_judge(client: Any, task: ProgramTask) -> str:
        answer = (await client.chat.completions.create(**_ask(task))).choices[0].message.content
        judge = client.with_options(base_url=judge_url)  # shares the client's transport
        await judge.chat.completions.create(model="judge", messages=[{"role": "user", "content": answer}], max_tokens=2)
        return answer

    [rollout] = await OpenAIProgramProtocol(asks_a_judge, base_url=base_url).run(
        env=LetterRepeatEnv(), max_steps=4, env_seed=0
    )
    assert len(rollout.steps) == 1  # was: the judge's reply recorded and trained as a policy sample
