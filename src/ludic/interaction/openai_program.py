"""An agent program written against the OpenAI SDK, run as an episode.

``program(client, task)`` is any function, sync or async, that takes an ``openai.OpenAI`` /
``openai.AsyncOpenAI`` (pointed at Ludic's server or vLLM) and a ``ProgramTask``, and returns either
a reward (a number) or an answer (a string) that the env scores as its one action. Every chat call it
makes is recorded at the HTTP level (``ludic.inference.call_recorder``) and becomes one Step with the
exact prompt/completion ids, sampling log-probs, temperature and policy version; the last step carries
the episode's reward, so any credit assigner gives every call the episode's credit. Where a call's
prompt ids begin with the previous call's prompt + completion ids, ``RolloutEngine(one_sequence=True)``
trains the calls as one sequence; where they do not, the step's ``info["sequence_break"]`` says why.

Failures (counted by the RolloutEngine as failed episodes, never trained): the program raises (or
calls ``sys.exit``), runs past ``timeout_s``, makes no chat call, returns neither a number nor a string, or a call could not be
recorded (an error status, a streamed call, a response without token ids, a call still in flight
when the program returned, a call through a client kept from another episode).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ludic.envs.env import LudicEnv
from ludic.inference.sampling import InferenceSpec
from ludic.interaction.base import InteractionProtocol
from ludic.interaction.steps import SEED_STRIDE, episode_meta
from ludic.types import Rollout, Step

Program = Callable[[Any, "ProgramTask"], Any]
MAX_ABANDONED_THREADS = 64
"""Sync programs still running past their timeout after which new sync programs are refused (named)."""
_ABANDONED: set[threading.Thread] = set()


class ProgramFailed(RuntimeError):
    """The episode's program cannot be trained on; the message says why."""


@dataclass(frozen=True)
class ProgramTask:
    """What a program is asked to do: the env's first observation, its system prompt and reset info."""

    prompt: str
    system_prompt: str | None
    model: str
    info: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None


class OpenAIProgramProtocol(InteractionProtocol):
    """Runs ``program`` once per episode against an env with one agent id.

    base_url: the OpenAI-compatible root (``http://127.0.0.1:8000/v1``). model: sent as ``task.model``.
    timeout_s: the program's limit when the engine gives none. attach_token_ids: send replies back
    with their ids (Ludic's server; False for vLLM, whose chat route re-renders the text).
    """

    def __init__(
        self,
        program: Program,
        *,
        base_url: str,
        model: str = "ludic",
        api_key: str = "EMPTY",
        timeout_s: float | None = 300.0,
        attach_token_ids: bool = True,
    ) -> None:
        if not callable(program):
            raise TypeError(f"program must be callable as program(client, task), got {program!r}")
        self.program, self.base_url, self.model, self.api_key = program, base_url, model, api_key
        self.timeout_s, self.attach_token_ids = timeout_s, attach_token_ids

    async def run(
        self,
        *,
        env: LudicEnv,
        max_steps: int,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
        inference: InferenceSpec | None = None,
        timeout_s: float | None = None,
    ) -> list[Rollout]:
        from ludic.inference.call_recorder import CallRecorder  # needs httpx (the openai extra)

        ids = list(env.agent_ids)
        if len(ids) != 1:
            raise ValueError(f"OpenAIProgramProtocol needs an env with one agent id, {type(env).__name__} has {ids}")
        obs, info = env.reset(seed=env_seed)[ids[0]]
        task = ProgramTask(obs, env.suggested_sysprompt, self.model, dict(info), env_seed)
        defaults = {} if inference is None else _sampling_fields(inference)
        seed_base = None if sampling_seed is None else sampling_seed * SEED_STRIDE
        recorder = CallRecorder(max_calls=max_steps, defaults=defaults, seed_base=seed_base,
                                attach_token_ids=self.attach_token_ids)  # fmt: skip
        limit = timeout_s if timeout_s is not None else self.timeout_s
        try:
            async with asyncio.timeout(limit):
                result = await self._call_program(task, recorder)
        except TimeoutError as exc:
            raise ProgramFailed(f"program exceeded timeout_s={limit}") from exc
        except SystemExit as exc:  # a script's sys.exit() ends its own episode, not the training run
            raise ProgramFailed(f"program called sys.exit({exc.code!r})") from exc
        except Exception as exc:  # the SDK reports a refused call as a connection error: name the reason
            if recorder.errors:
                raise ProgramFailed(f"program raised after a call was refused: {recorder.errors[0]}") from exc
            cause = exc.__cause__
            if type(exc).__name__ == "APIConnectionError" and cause is not None:  # e.g. a client closed earlier
                raise ProgramFailed(f"program raised {exc} ({type(cause).__name__}: {cause})") from exc
            raise
        finally:
            recorder.seal()
        _check_recording(recorder)
        reward, action = await _score(env, ids[0], result)
        steps = calls_to_steps(recorder.calls, reward, action)
        return [Rollout(steps=steps, meta={**episode_meta(ids[0], steps), "num_calls": len(steps)})]

    async def _call_program(self, task: ProgramTask, recorder: Any) -> Any:
        import httpx

        from ludic.inference.call_recorder import EPISODE, RecordingAsyncTransport, RecordingTransport

        openai = _import_openai()
        kwargs = {"base_url": self.base_url, "api_key": self.api_key, "max_retries": 0}
        # the program's tasks and worker thread inherit EPISODE: a call it makes through a client kept
        # from another episode is refused and fails this episode, never recorded in the other one
        bound = EPISODE.set(recorder)
        try:
            if _is_async(self.program):
                transport = RecordingAsyncTransport(recorder, policy_url=self.base_url)
                http = httpx.AsyncClient(transport=transport, timeout=None)
                async with openai.AsyncOpenAI(http_client=http, **kwargs) as client:
                    return await self.program(client, task)
            # a sync program runs on a thread of its own; past its timeout the thread is abandoned (Python
            # cannot stop it) and the sealed recorder refuses (and only counts) its further calls
            sync_http = httpx.Client(transport=RecordingTransport(recorder, policy_url=self.base_url), timeout=None)
            client = openai.OpenAI(http_client=sync_http, **kwargs)
            return await _on_own_thread(_run_and_close, self.program, client, task)
        finally:
            EPISODE.reset(bound)


def calls_to_steps(calls: list[Any], reward: float, action: str | None) -> list[Step]:
    """One Step per recorded call; the last holds the episode's reward and ends it."""
    steps = []
    for i, call in enumerate(calls):
        info: dict[str, Any] = {
            "call_index": i,
            "finish_reason": call.trace.finish_reason,
            "policy_version": call.policy_version,
            "sampling_temperature": call.temperature,
            "sampling_top_p": call.top_p,
            "parse_error": False,
        }
        why = _sequence_break(calls[i - 1], call) if i else None
        if why:
            info["sequence_break"] = why
        last = i == len(calls) - 1
        if last:
            info["parsed_action"] = action
        user = [m.get("content") for m in call.messages if isinstance(m, dict) and m.get("role") == "user"]
        steps.append(Step(index=i, prev_obs=user[-1] if user else None, action=call.text, next_obs=None,
                          reward=reward if last else 0.0, truncated=False, terminated=last, info=info,
                          trace=call.trace))  # fmt: skip
    return steps


def _sequence_break(prev: Any, call: Any) -> str | None:
    head = [*prev.trace.prompt_token_ids, *prev.trace.completion_token_ids]
    if call.trace.prompt_token_ids[: len(head)] == head:
        return None
    if call.server_sequence_break:
        return f"the chat template rewrote the history: {call.server_sequence_break}"
    return ("the prompt ids do not begin with the previous call's prompt + completion ids (a new "
            "conversation, or the reply was sent back edited or without its token ids)")  # fmt: skip


def _check_recording(recorder: Any) -> None:
    if recorder.errors:
        raise ProgramFailed(f"{recorder.error_count} model call(s) not recorded; first: {recorder.errors[0]}")
    if recorder.in_flight:
        raise ProgramFailed(f"program returned with {recorder.in_flight} model call(s) still in flight")
    if not recorder.calls:
        raise ProgramFailed("program made no chat completion call: nothing to train")


async def _score(env: LudicEnv, agent_id: str, result: Any) -> tuple[float, str | None]:
    """(reward, the answer the env scored or None): a number is the reward, a string the env's action."""
    if isinstance(result, (int, float)) and not isinstance(result, bool):
        if not math.isfinite(result):
            raise ProgramFailed(f"program returned a non-finite reward {result!r}")
        return float(result), None
    if isinstance(result, str):
        outcome = (await env.astep({agent_id: result}))[agent_id]
        return float(outcome.reward), result
    raise ProgramFailed(f"program returned {type(result).__name__}: return a reward (number) or an answer (str)")


def _sampling_fields(inference: InferenceSpec) -> dict[str, Any]:
    s = inference.sampling
    fields = {"temperature": s.temperature, "top_p": s.top_p, "max_tokens": s.max_tokens}
    return {**fields, "stop": list(s.stop)} if s.stop else fields


def _is_async(program: Program) -> bool:
    call = type(program).__call__ if not inspect.isfunction(program) else program
    return inspect.iscoroutinefunction(program) or inspect.iscoroutinefunction(call)


async def _on_own_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` on a new thread (with this context), not on the loop's shared executor: programs hung
    past their timeout would fill that pool, and every later ``to_thread`` in the process (other episodes'
    programs, tools) would wait behind them. At most ``MAX_ABANDONED_THREADS`` hung ones are kept."""
    _ABANDONED.difference_update([t for t in _ABANDONED if not t.is_alive()])
    if len(_ABANDONED) >= MAX_ABANDONED_THREADS:
        raise ProgramFailed(f"{len(_ABANDONED)} sync programs abandoned past their timeout are still running "
                            "(MAX_ABANDONED_THREADS): fix the program that hangs")  # fmt: skip
    loop, context = asyncio.get_running_loop(), contextvars.copy_context()
    done: asyncio.Future[Any] = loop.create_future()

    def run() -> None:
        try:
            outcome: tuple[bool, Any] = (True, context.run(fn, *args))
        except BaseException as exc:  # handed to the awaiting episode
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for this any more
            loop.call_soon_threadsafe(_settle, done, outcome)

    thread = threading.Thread(target=run, name="ludic-openai-program", daemon=True)
    thread.start()
    try:
        return await done
    except asyncio.CancelledError:
        if thread.is_alive():
            _ABANDONED.add(thread)
        raise


def _settle(future: asyncio.Future[Any], outcome: tuple[bool, Any]) -> None:
    ok, value = outcome
    if future.done():
        return
    if ok:
        future.set_result(value)
    else:
        future.set_exception(value)


def _run_and_close(program: Program, client: Any, task: ProgramTask) -> Any:
    with client:
        return program(client, task)


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ImportError("OpenAIProgramProtocol needs the openai package: pip install 'ludic[openai]'") from exc
    return openai
