"""Flatten evaluated rollouts into per-step records (for Reducers) and per-episode JSON lines."""

from __future__ import annotations

from typing import Any

from ludic.types import Rollout


def step_records(rollouts: list[Rollout]) -> list[dict[str, Any]]:
    """One meta dict per evaluated step, shaped like a SAWItem's meta so Reducers read the same paths.

    Holds the training item keys (``rollout_id``, ``step_index``, ``reward``, ``total_reward``,
    ``truncated``, ``terminated``, ``finish_reason``, ``parse_error``, ``completion_length``,
    ``request_meta``) plus the env's step info at top level, so a reducer with
    ``source="correct"`` reads the env's ``info["correct"]``.
    """
    records = []
    for rollout in rollouts:
        for step in rollout.steps:
            meta: dict[str, Any] = dict(step.info)
            meta.update(
                rollout_id=rollout.id,
                step_index=step.index,
                reward=step.reward,
                total_reward=rollout.total_reward,
                truncated=step.truncated,
                terminated=step.terminated,
                finish_reason=step.info.get("finish_reason"),
                parse_error=bool(step.info.get("parse_error", False)),
                completion_length=len(step.trace.completion_token_ids) if step.trace else None,
                request_meta=rollout.meta.get("request_meta", {}),
                agent_id=rollout.meta.get("agent_id"),
            )
            records.append(meta)
    return records


def episode_record(rollout: Rollout) -> dict[str, Any]:
    """A JSON-ready summary of one episode: reward, seeds, and each step's prompt and answer; a failed
    episode (``meta["failed"]``) has ``failed: true`` and the engine's ``error`` (type, message)."""
    engine_meta = rollout.meta.get("engine", {})
    failed = bool(rollout.meta.get("failed"))
    return {
        "rollout_id": rollout.id,
        "failed": failed,
        **({"error": rollout.meta.get("error")} if failed else {}),
        "total_reward": rollout.total_reward,
        "length": rollout.length,
        "agent_id": rollout.meta.get("agent_id"),
        "env_seed": engine_meta.get("env_seed") if isinstance(engine_meta, dict) else None,
        "episode_truncated": rollout.meta.get("episode_truncated"),
        "truncation_reason": rollout.meta.get("truncation_reason"),
        "request_meta": rollout.meta.get("request_meta", {}),
        "steps": [
            {
                "index": s.index,
                "prev_obs": s.prev_obs,
                "action": s.action,
                "reward": s.reward,
                "truncated": s.truncated,
                "terminated": s.terminated,
                "info": {k: v for k, v in s.info.items() if k != "chat_response"},
            }
            for s in rollout.steps
        ],
    }
