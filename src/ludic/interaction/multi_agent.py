"""The multi-agent loop: every managed active agent acts, then the env steps once per turn."""

from __future__ import annotations

import asyncio
from typing import Any

from ludic.agents.base_agent import Agent
from ludic.envs.env import LudicEnv
from ludic.inference.sampling import InferenceSpec
from ludic.interaction.base import InteractionProtocol
from ludic.interaction.env_checks import checked_outcomes, checked_reset
from ludic.interaction.steps import (
    cut_at_max_steps,
    env_step,
    episode_meta,
    parse_failure_step,
    step_sampling,
)
from ludic.interaction.trace_collector import TraceCollector
from ludic.parsers import ParseResult
from ludic.types import Obs, Rollout, StepOutcome

REPLAY_OBS = "Another player's reply could not be parsed, so this turn is replayed. Send your move again."

Acted = list[tuple[str, ParseResult, dict[str, Any]]]


class MultiAgentProtocol(InteractionProtocol):
    """Drives the agents in ``agents``; env agents not in the dict are played by the env (bots).

    A turn: each managed agent in ``env.active_agents`` acts (concurrently); then
    ``env.step`` gets their parsed actions (``{}`` when only bots are active). If ANY of
    them fails to parse, ``env.step`` is not called at all that turn: failing agents get a
    synthetic parse-error step with the parser's obs; the others get a step with
    ``info["turn_replayed"]=True`` and are asked again. Outcomes that reach an agent off
    turn are credited to its latest step (TraceCollector). ``max_steps`` counts turns.
    """

    def __init__(self, agents: dict[str, Agent], *, use_env_sysprompt: bool = True) -> None:
        if not agents:
            raise ValueError("MultiAgentProtocol needs at least one agent")
        self.agents = dict(agents)
        self.use_env_sysprompt = use_env_sysprompt

    async def _episode(
        self, env: LudicEnv, max_steps: int, env_seed: int | None, sampling_seed: int | None,
        inference: InferenceSpec | None,
    ) -> list[Rollout]:  # fmt: skip
        unknown = sorted(set(self.agents) - set(env.agent_ids))
        if unknown:
            raise ValueError(f"agents {unknown} are not in {type(env).__name__}.agent_ids {env.agent_ids}")
        reset = env.reset(seed=env_seed)
        first = {aid: checked_reset(reset, aid) for aid in self.agents}
        for aid, agent in self.agents.items():
            sysprompt = (
                env.suggested_sysprompt
                if self.use_env_sysprompt and agent.ctx.system_prompt is None
                else None
            )
            agent.reset(system_prompt=sysprompt)
            agent.on_env_reset(*first[aid])
        # per-episode state (a protocol runs one episode at a time: build one per episode)
        self._latest: dict[str, Obs | None] = {aid: first[aid][0] for aid in self.agents}
        self._pending: dict[str, Obs | None] = dict.fromkeys(self.agents)
        collector = TraceCollector(list(self.agents))

        for turn in range(max_steps):
            if not env.active_agents:
                break
            active = [a for a in env.active_agents if a in self.agents]
            acted = await self._act_all(active, turn, inference, sampling_seed)
            if any(parse.action is None for _, parse, _ in acted):
                self._replay_turn(collector, acted)
                continue
            outcomes = checked_outcomes(
                await env.astep({a: parse.action for a, parse, _ in acted}), active, list(self.agents)
            )
            if self._absorb(collector, acted, outcomes):
                break
        else:
            for aid in self.agents:
                last = collector.last_step(aid)
                if last is not None and not (last.terminated or last.truncated):
                    cut_at_max_steps(last)
        rollouts = collector.rollouts()
        for r in rollouts:
            r.meta.update(episode_meta(r.meta["agent_id"], r.steps))
        return rollouts

    async def _act_all(
        self, active: list[str], turn: int, inference: InferenceSpec | None, sampling_seed: int | None
    ) -> Acted:
        """Feed each active agent its pending obs, then let them all act concurrently.

        Seeds: sampling_seed * 1000 + turn * n_agents + the agent's position in ``agents``.
        """
        order = {aid: i for i, aid in enumerate(self.agents)}
        for aid in active:
            if self._pending[aid] is not None:
                self.agents[aid].on_after_step(self._pending[aid], {})
                self._pending[aid] = None
        offsets = {a: turn * len(self.agents) + order[a] for a in active}
        results = await asyncio.gather(
            *(
                self.agents[a].act(
                    sampling=step_sampling(self.agents[a].sampling, inference, sampling_seed, offsets[a])
                )
                for a in active
            )
        )
        return [(a, parse, info) for a, (parse, info) in zip(active, results)]

    def _replay_turn(self, collector: TraceCollector, acted: Acted) -> None:
        """Some reply failed to parse: record synthetic steps; the env is not stepped."""
        for aid, parse, info in acted:
            step = parse_failure_step(collector.num_steps(aid), self._latest[aid], parse, info)
            if parse.action is not None:  # parsed fine, but the turn is void: ask again
                step.next_obs = REPLAY_OBS
                step.info.update(parse_error=False, parsed_action=parse.action, turn_replayed=True)
            collector.record(aid, step)
            self._latest[aid] = self._pending[aid] = step.next_obs

    def _absorb(self, collector: TraceCollector, acted: Acted, outcomes: dict[str, StepOutcome]) -> bool:
        """Record the turn's outcomes; True when every managed agent's episode has ended."""
        acting = {aid for aid, _, _ in acted}
        for aid, parse, info in acted:
            collector.record(
                aid, env_step(collector.num_steps(aid), self._latest[aid], parse, info, outcomes[aid])
            )
        for aid, out in outcomes.items():
            if aid not in self.agents:
                continue
            if aid not in acting:
                extra = {**out.info, **({"truncation_reason": "env"} if out.truncated else {})}
                collector.credit_latest(
                    aid,
                    reward=out.reward,
                    next_obs=out.obs,
                    terminated=out.terminated,
                    truncated=out.truncated,
                    info=extra,
                )
            if not (out.terminated or out.truncated):
                self._latest[aid] = self._pending[aid] = out.obs
        ended = []
        for aid in self.agents:
            last = collector.last_step(aid)
            ended.append(last is not None and (last.terminated or last.truncated))
        return all(ended)
