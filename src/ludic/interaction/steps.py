"""Small helpers the protocols share: per-step sampling seeds and Step construction."""

from __future__ import annotations

from typing import Any

from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.interaction.env_checks import real_reward
from ludic.parsers import ParseResult
from ludic.types import Obs, Step, StepOutcome

SEED_STRIDE = 1000  # step seeds: sampling_seed * SEED_STRIDE + step offset


def step_sampling(
    default: SamplingConfig, inference: InferenceSpec | None, sampling_seed: int | None, offset: int
) -> SamplingConfig:
    """The sampling for one model call: the request's config if it has one, else the agent's.

    The request's ``inference.sampling`` wins whole over ``Agent(sampling=)`` (see
    ``ludic.inference.sampling`` for the full order); seed = sampling_seed * 1000 + offset, so an
    episode replays exactly given its seed.
    """
    base = inference.sampling if inference is not None else default
    if sampling_seed is None:
        return base
    return base.with_seed(sampling_seed * SEED_STRIDE + offset)


def _agent_info(parse: ParseResult, act_info: dict[str, Any]) -> dict[str, Any]:
    extra = {"sequence_break": act_info["sequence_break"]} if act_info.get("sequence_break") else {}
    return {
        **extra,
        "parsed_action": parse.action,
        "parse_error": parse.action is None,
        "parser_reward": parse.reward,
        "finish_reason": act_info.get("finish_reason"),
        "policy_version": act_info.get("policy_version"),
        "sampling_temperature": act_info.get("sampling_temperature"),
        "sampling_top_p": act_info.get("sampling_top_p"),
    }


def _parser_reward(parse: ParseResult) -> float:
    """The parser's format reward; a non-number (None, a str) fails the episode, named."""
    return real_reward(parse.reward, "parser result")


def parse_failure_step(
    index: int, prev_obs: Obs | None, parse: ParseResult, act_info: dict[str, Any]
) -> Step:
    """Synthetic step for a reply the parser rejected: the env was not stepped."""
    return Step(
        index=index,
        prev_obs=prev_obs,
        action=act_info["raw_text"],
        next_obs=parse.obs,
        reward=_parser_reward(parse),
        truncated=False,
        terminated=False,
        info=_agent_info(parse, act_info),
        trace=act_info.get("trace"),
        tool_traces=list(act_info.get("tool_traces", [])),
    )


def env_step(
    index: int, prev_obs: Obs | None, parse: ParseResult, act_info: dict[str, Any], outcome: StepOutcome
) -> Step:
    """Step for an action the env applied; reward = env reward + parser reward."""
    done = outcome.terminated or outcome.truncated
    info = {**outcome.info, **_agent_info(parse, act_info), "env_reward": float(outcome.reward)}
    if outcome.truncated:
        info["truncation_reason"] = "env"
    if done and outcome.obs is not None:
        info["final_obs"] = outcome.obs
    return Step(
        index=index,
        prev_obs=prev_obs,
        action=act_info["raw_text"],
        next_obs=None if done else outcome.obs,
        reward=float(outcome.reward) + _parser_reward(parse),
        truncated=outcome.truncated,
        terminated=outcome.terminated,
        info=info,
        trace=act_info.get("trace"),
        tool_traces=list(act_info.get("tool_traces", [])),
    )


def cut_at_max_steps(step: Step) -> None:
    """Mark the last step of an episode stopped by ``max_steps`` as truncated."""
    step.truncated = True
    step.next_obs = None
    step.info["truncation_reason"] = "max_steps"


def episode_meta(agent_id: str, steps: list[Step]) -> dict[str, Any]:
    """Rollout meta: who this rollout belongs to and whether/why it was truncated."""
    last = steps[-1] if steps else None
    truncated = bool(last is not None and last.truncated and not last.terminated)
    reason = last.info.get("truncation_reason") if truncated and last is not None else None
    return {"agent_id": agent_id, "episode_truncated": truncated, "truncation_reason": reason}
