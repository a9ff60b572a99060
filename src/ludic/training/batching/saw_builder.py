"""Rollouts + credit -> SAW items and batch metadata.

Training sees exactly the sampled tokens: ``input_ids = prompt_token_ids + completion_token_ids``
from each step's TokenTrace, never a re-tokenisation of the text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ludic.training.types import ActorTokenLogps, RolloutStepKey, SampleAttachments, SAWItem
from ludic.types import Rollout, Step, TokenTrace


def prompt_completion_item(
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    weight: float,
    meta: dict[str, Any] | None = None,
    actor_logps: Sequence[float] | None = None,
) -> SAWItem:
    """A SAW item whose state is ``prompt`` and whose action is ``completion`` (no padding)."""
    n_prompt, n_completion = len(prompt), len(completion)
    actor = None if actor_logps is None else ActorTokenLogps([float(x) for x in actor_logps])
    return SAWItem(
        input_ids=[*prompt, *completion],
        attention_mask=[1] * (n_prompt + n_completion),
        action_mask=[0] * n_prompt + [1] * n_completion,
        weight=float(weight),
        meta={} if meta is None else meta,
        attachments=SampleAttachments(actor_logps=actor),
    )


def step_to_saw_item(rollout: Rollout, step: Step, weight: float) -> SAWItem:
    """The SAW item of a step's final reply (the action); raises if the step has no token trace."""
    return _call_item(rollout, step, step.trace, weight, call_index=len(step.tool_traces))


def step_to_saw_items(rollout: Rollout, step: Step, weight: float) -> list[SAWItem]:
    """One SAW item per model call of the step, in order: each tool-call reply, then the final
    reply. All carry the step's credit; tool results are in later calls' prompts, never actions."""
    items = [
        _call_item(rollout, step, trace, weight, call_index=i) for i, trace in enumerate(step.tool_traces)
    ]
    items.append(step_to_saw_item(rollout, step, weight))
    return items


def _call_item(
    rollout: Rollout, step: Step, trace: TokenTrace | None, weight: float, *, call_index: int
) -> SAWItem:
    where = f"rollout {rollout.id!r} step {step.index}" + (f" call {call_index}" if step.tool_traces else "")
    if trace is None:
        raise ValueError(
            f"missing rollout-time token trace for {where}: the client must return prompt/completion "
            "token ids (Ludic never re-tokenises generated text)"
        )
    prompt, completion = list(trace.prompt_token_ids), list(trace.completion_token_ids)
    if not completion:
        raise ValueError(f"{where}: empty completion in the token trace")
    request_meta = rollout.meta.get("request_meta", {})
    meta: dict[str, Any] = {
        "rollout_id": rollout.id,
        "step_index": step.index,
        "call_index": call_index,
        "tool_call": call_index < len(step.tool_traces),
        "agent_id": rollout.meta.get("agent_id"),
        "total_reward": rollout.total_reward,
        "reward": step.reward,
        "truncated": step.truncated,
        "terminated": step.terminated,
        "episode_truncated": rollout.meta.get("episode_truncated", False),
        "truncation_reason": rollout.meta.get("truncation_reason"),
        "request_meta": request_meta,
        "group_id": request_meta.get("group_id"),
        "policy_version": step.info.get("policy_version"),
        "finish_reason": trace.finish_reason,
        "parse_error": bool(step.info.get("parse_error", False)),
        "prompt_length": len(prompt),
        "completion_length": len(completion),
    }
    # env/step info keys (e.g. "all_passed", "result") sit at the top level so reducers can name them
    meta = {**_json_safe(step.info), **meta}
    return prompt_completion_item(
        prompt, completion, weight=weight, meta=meta, actor_logps=trace.completion_logprobs
    )


def rollouts_to_saw_items(
    rollouts: Sequence[Rollout], weights: Mapping[RolloutStepKey, float]
) -> list[SAWItem]:
    """Every model call of every step becomes an item with its step's weight."""
    items = []
    for rollout in rollouts:
        for step in rollout.steps:
            key = (rollout.id, step.index)
            if key not in weights:
                raise KeyError(f"credit assigner gave no weight for rollout {rollout.id!r} step {step.index}")
            items.extend(step_to_saw_items(rollout, step, weights[key]))
    return items


def batch_meta(
    *, target_rollouts: int, rollouts: Sequence[Rollout], items: Sequence[SAWItem], failed: int
) -> dict[str, float]:
    """The batch-level numbers the Trainer logs (``target_rollouts``, ``effective_rollouts``, ...)."""
    return {
        "target_rollouts": float(target_rollouts),
        "effective_rollouts": float(len({it.meta["rollout_id"] for it in items})),
        "failed_rollouts": float(failed),
        "num_samples": float(len(items)),
        "avg_total_reward": _mean([r.total_reward for r in rollouts]),
        "avg_completion_length": _mean([it.meta["completion_length"] for it in items]),
    }


def _mean(values: Sequence[float]) -> float:
    return float(sum(values) / len(values)) if values else 0.0


def _json_safe(info: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON-friendly part of a step's info (for reducers and JSONL); objects are dropped."""
    safe = {}
    for key, value in info.items():
        if isinstance(value, (str, int, float, bool, type(None))):
            safe[key] = value
        elif isinstance(value, (list, tuple)) and all(isinstance(v, (str, int, float, bool)) for v in value):
            safe[key] = list(value)
    return safe
