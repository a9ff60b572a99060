"""The synchronous single-agent loop: act, parse, step, record; one rollout per episode."""

from __future__ import annotations

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
from ludic.types import Rollout, Step


class SingleAgentProtocol(InteractionProtocol):
    """Drives one agent against an env with exactly one agent id.

    Per step: ``agent.act()``; a parse failure (including a reply cut at the token limit)
    records a synthetic step with the parser's reward and obs and does NOT call
    ``env.step``; the obs goes back to the agent as a user message. Otherwise the parsed
    action is applied and the step's reward is env reward + parser reward.

    use_env_sysprompt: give the agent the env's ``suggested_sysprompt`` when its context
    has no system prompt of its own.
    """

    def __init__(self, agent: Agent, *, use_env_sysprompt: bool = True) -> None:
        self.agent = agent
        self.use_env_sysprompt = use_env_sysprompt

    async def _episode(
        self, env: LudicEnv, max_steps: int, env_seed: int | None, sampling_seed: int | None,
        inference: InferenceSpec | None,
    ) -> list[Rollout]:  # fmt: skip
        agent_id = _single_agent_id(env)
        sysprompt = None
        if self.use_env_sysprompt and self.agent.ctx.system_prompt is None:
            sysprompt = env.suggested_sysprompt
        self.agent.reset(system_prompt=sysprompt)
        obs, info = checked_reset(env.reset(seed=env_seed), agent_id)
        self.agent.on_env_reset(obs, info)

        steps: list[Step] = []
        for index in range(max_steps):
            sampling = step_sampling(self.agent.sampling, inference, sampling_seed, index)
            parse, act_info = await self.agent.act(sampling=sampling)
            if parse.action is None:
                step = parse_failure_step(index, obs, parse, act_info)
                steps.append(step)
                self.agent.on_after_step(parse.obs, {})
                obs = parse.obs
                continue
            outcomes = checked_outcomes(await env.astep({agent_id: parse.action}), [agent_id], [agent_id])
            outcome = outcomes[agent_id]
            step = env_step(index, obs, parse, act_info, outcome)
            steps.append(step)
            if step.terminated or step.truncated:
                break
            self.agent.on_after_step(outcome.obs, outcome.info)
            obs = outcome.obs
        else:
            cut_at_max_steps(steps[-1])
        return [Rollout(steps=steps, meta=episode_meta(agent_id, steps))]


def _single_agent_id(env: LudicEnv) -> str:
    ids = list(env.agent_ids)
    if len(ids) != 1:
        raise ValueError(
            f"SingleAgentProtocol needs an env with exactly one agent id, {type(env).__name__} has {ids}; "
            "use MultiAgentProtocol"
        )
    return ids[0]


SingleAgentSyncProtocol = SingleAgentProtocol
