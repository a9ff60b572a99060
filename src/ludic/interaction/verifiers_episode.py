"""A verifiers (0.4, ``verifiers.v1``) ``Env`` played unchanged, one Ludic rollout per trainable agent run.

``VerifiersEnv`` alone scores one reply of Ludic's agent. This protocol runs the verifiers ``Env`` object
itself: its ``run()`` (one agent, a modelled user, several seats), its agents' harness programs (the chat
loop, tools from MCP toolsets, ``@vf.stop`` hooks, turn limits) in the runtime the env configures, and
its scoring (the task's ``@vf.reward`` methods, plugged rewards and judges, the env's ``finalize``). Only
the model endpoint is Ludic's: ``ModelContext.client.base_url`` points at a loopback ``CallRelay`` in
front of ``base_url``, which records every call of each agent run with its exact ids
(``ludic.interaction.verifiers_calls``).

A trainable run becomes a rollout of one step per model call (``calls_to_steps``: exact ids, log-probs,
temperature, policy version); the last step carries the run's verifiers reward and ends it. A run that
verifiers stopped at a limit (``max_turns``, token budgets, a length-cut last reply) is scored all the
same and marked truncated (``truncation_reason`` = the stop condition). Untrainable runs (a modelled
user) are played and not returned.

Failures, raised as ``VerifiersEpisodeFailed`` (the rollout engine counts them; nothing trains on them):
the episode or a run ended in error or past a deadline, a trainable run made no model call, a call was
refused or not recorded (also one opening more runs than the relay's ``max_sessions``), a reward is
unscored or not finite, or the episode exceeded ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
from pathlib import Path
from typing import Any

from ludic.envs.env import LudicEnv
from ludic.inference.sampling import InferenceSpec
from ludic.interaction.base import InteractionProtocol
from ludic.interaction.openai_program import _sampling_fields, calls_to_steps
from ludic.interaction.steps import SEED_STRIDE, episode_meta
from ludic.interaction.verifiers_calls import CallRelay
from ludic.types import Rollout


class VerifiersEpisodeFailed(RuntimeError):
    """The episode cannot be trained on; the message names the run and the reason."""


class VerifiersEpisodeProtocol(InteractionProtocol):
    """Plays ``env.vf_env`` (a ``VerifiersEnv`` built from a verifiers ``Env`` or ``env_config``) on
    the task ``env.reset(seed=env_seed)`` picks.

    base_url: the model server's OpenAI root (Ludic's server: ``http://127.0.0.1:8000/v1``).
    model: the model name sent. timeout_s: the episode's limit when the engine gives none.
    harness_python: run verifiers' chat program (the ``null`` and ``bash`` harnesses) in the subprocess
    runtime with this interpreter, whose environment holds its dependencies (Ludic's own venv does), instead
    of a uv-built one (uv and a package index on first use); None leaves verifiers' default.
    ``max_steps`` bounds the model calls of each agent run.
    """

    def __init__(
        self,
        *,
        base_url: str,
        model: str = "ludic",
        timeout_s: float | None = 600.0,
        harness_python: str | None = None,
    ) -> None:
        self.base_url, self.model, self.timeout_s = base_url, model, timeout_s
        if harness_python is not None:
            use_python_for_chat_program(harness_python)

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
        vf_env = getattr(env, "vf_env", None)
        if vf_env is None:
            raise TypeError(
                f"VerifiersEpisodeProtocol plays a VerifiersEnv built from a verifiers Env (env=... or "
                f"env_config=...), got {type(env).__name__} without one"
            )
        env.reset(seed=env_seed)
        relay = CallRelay(
            self.base_url,
            max_calls=max_steps,
            defaults={} if inference is None else _sampling_fields(inference),
            seed_base=None if sampling_seed is None else sampling_seed * SEED_STRIDE,
        )
        limit = timeout_s if timeout_s is not None else self.timeout_s
        async with relay:
            episode = await _play(vf_env, env.task, self._context(relay.base_url), limit)  # type: ignore[attr-defined]
            return episode_rollouts(episode, relay)

    def _context(self, base_url: str) -> Any:
        import verifiers.v1 as vf

        return vf.ModelContext(model=self.model, client=vf.EvalClientConfig(base_url=base_url))


def use_python_for_chat_program(python: str) -> None:
    """Offline runs: verifiers' subprocess runtime caches the interpreter of each prepared PEP 723 program by
    its path (``scripts_dir/<sha256>.py``); writing the chat program there and caching ``python`` for it
    skips the uv bootstrap. Relies on verifiers 0.4's ``SubprocessRuntime`` cache (checked, named if gone)."""
    from verifiers.v1.harnesses.utils.launch import CHAT_PROGRAM_SOURCE
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    cache = getattr(SubprocessRuntime, "_interpreters", None)
    if not isinstance(cache, dict) or not isinstance(getattr(SubprocessRuntime, "scripts_dir", None), str):
        raise RuntimeError(
            "harness_python: this verifiers release has no SubprocessRuntime script cache; leave it None"
        )
    data = CHAT_PROGRAM_SOURCE.encode()
    path = Path(SubprocessRuntime.scripts_dir) / f"{hashlib.sha256(data).hexdigest()}.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    cache[str(path)] = os.path.abspath(python)  # absolute: the program runs in the runtime's own folder


async def _play(vf_env: Any, task: Any, ctx: Any, limit: float | None) -> Any:
    try:
        async with asyncio.timeout(limit):
            async with vf_env.serving():
                return await vf_env.run_episode(task, ctx)
    except TimeoutError as exc:
        raise VerifiersEpisodeFailed(f"verifiers episode exceeded timeout_s={limit}") from exc


def episode_rollouts(episode: Any, relay: CallRelay) -> list[Rollout]:
    """One rollout per trainable run of a finished episode; raises VerifiersEpisodeFailed if any is unusable."""
    _check_episode(episode)
    if relay.errors:
        raise VerifiersEpisodeFailed(f"verifiers episode: a model call was refused: {relay.errors[0]}")
    rollouts = [_run_rollout(trace, relay) for trace in episode.traces if trace.agent.trainable]
    if not rollouts:
        raise VerifiersEpisodeFailed("verifiers episode has no trainable agent run: nothing to train")
    return rollouts


def _check_episode(episode: Any) -> None:
    errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
    if errors:
        raise VerifiersEpisodeFailed(f"verifiers episode failed: {errors[0].type}: {errors[0].message}")
    if episode.is_timeout or any(t.is_timeout for t in episode.traces):
        late = next((t.stop_condition for t in episode.traces if t.is_timeout), "the episode deadline")
        raise VerifiersEpisodeFailed(f"verifiers episode ran past a deadline ({late})")
    if not episode.ok:
        raise VerifiersEpisodeFailed("verifiers episode did not finish ok")


def _run_rollout(trace: Any, relay: CallRelay) -> Rollout:
    name = trace.agent.name
    problems = relay.problems(trace.id)
    if problems:
        raise VerifiersEpisodeFailed(
            f"agent run {name!r}: {len(problems)} model call(s) not recorded: {problems[0]}"
        )
    calls = relay.calls(trace.id)
    if not calls:
        raise VerifiersEpisodeFailed(f"agent run {name!r} made no model call: nothing to train")
    unscored = sorted(k for k, r in trace.rewards.items() if r is None)
    if unscored:
        raise VerifiersEpisodeFailed(f"agent run {name!r}: rewards {unscored} were not scored")
    reward = float(trace.reward)
    if not math.isfinite(reward):
        raise VerifiersEpisodeFailed(f"agent run {name!r} scored a non-finite reward {reward}")
    steps = calls_to_steps(calls, reward, trace.last_reply)
    last = steps[-1]
    last.info.update(
        vf_rewards={k: r.score for k, r in trace.rewards.items() if r is not None},
        vf_metrics={k: v for k, v in trace.metrics.items() if v is not None},
        stop_condition=trace.stop_condition,
    )
    if trace.is_truncated:  # stopped at a limit, scored all the same
        last.truncated = True
        limits = (
            "max_turns",
            "max_input_tokens",
            "max_output_tokens",
            "max_total_tokens",
            "compaction_failed",
        )
        last.info["truncation_reason"] = trace.stop_condition if trace.stop_condition in limits else "length"
    meta = {**episode_meta(name, steps), "num_calls": len(steps), "vf_trace_id": trace.id}
    return Rollout(steps=steps, meta=meta)


def verifiers_episode_protocol(
    *,
    agent: Any,
    base_url: str | None = None,
    timeout_s: float | None = 600.0,
    harness_python: str | None = None,
) -> VerifiersEpisodeProtocol:
    """The ``verifiers_episode`` protocol kind for ``ludic train`` configs: the run's server plays the model.

    base_url: the OpenAI ``/v1`` root; default: the run's server (``[inference] backend = "server"``).
    The run's harness (``agent``) gives only its client's URL and model name: verifiers' harness samples.
    """
    if base_url is None:
        server = getattr(getattr(agent, "client", None), "base_url", None)
        if not server:
            raise ValueError(
                'verifiers_episode: verifiers calls the model over HTTP; set [inference] backend = "server" '
                "with server_url, or [protocol].kwargs.base_url"
            )
        base_url = server.rstrip("/") + "/v1"
    model = str(getattr(agent, "model", None) or "ludic")
    return VerifiersEpisodeProtocol(
        base_url=base_url, model=model, timeout_s=timeout_s, harness_python=harness_python
    )
