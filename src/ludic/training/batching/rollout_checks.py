"""What the engine checks on a protocol's rollouts before it accepts an episode.

A check that fails here fails only its episode (recorded, counted, its GRPO group left out), where
the same bad value found later (a NaN reward in group normalisation, an empty completion while the
SAW items are built) would take the whole batch down. The checks cover every protocol, including
ones that do not build their steps through ``ludic.interaction.steps``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from ludic.interaction.env_checks import finite_reward, real_reward
from ludic.training.batching.jsonl import check_token_ids, rollout_to_dict
from ludic.types import Rollout, Step, TokenTrace

log = logging.getLogger(__name__)


def check_episode_rollouts(
    rollouts: Sequence[Rollout], max_steps: int, protocol_kind: str, *, for_training: bool
) -> None:
    """Raise naming the rollout and step unless every rollout fits ``max_steps`` and its steps have real
    rewards and bool end flags; ``for_training`` also needs finite rewards (and a finite total, which
    credit sums) and the token traces training is built from."""
    for rollout in rollouts:
        if len(rollout.steps) > max_steps:
            raise RuntimeError(
                f"protocol {protocol_kind!r} returned a rollout with {len(rollout.steps)} steps, "
                f"max_steps={max_steps}"
            )
        for step in rollout.steps:
            where = f"protocol {protocol_kind!r} rollout {rollout.id!r} step {step.index}"
            (finite_reward if for_training else real_reward)(step.reward, where)
            for name in ("terminated", "truncated"):
                if not isinstance(getattr(step, name), bool):
                    raise TypeError(f"{where}: {name} must be a bool, got {getattr(step, name)!r:.80}")
            if for_training:
                _check_traces(step, where)
        if for_training:
            finite_reward(rollout.total_reward, f"protocol {protocol_kind!r} rollout {rollout.id!r} total")


def _check_traces(step: Step, where: str) -> None:
    traces: list[TokenTrace | None] = [*step.tool_traces, step.trace]
    for i, trace in enumerate(traces):
        call = f"{where} call {i}"
        if trace is None:
            raise ValueError(
                f"{call}: no rollout-time token trace (the client must return prompt/completion token ids; "
                "Ludic never re-tokenises generated text)"
            )
        check_token_ids(f"{call} prompt_token_ids", trace.prompt_token_ids)
        check_token_ids(f"{call} completion_token_ids", trace.completion_token_ids)
        if not trace.completion_token_ids:
            raise ValueError(f"{call}: empty completion (the model returned no tokens), nothing to train on")


def rollout_jsonl_line(rollout: Rollout) -> str:
    """The rollout as one JSON line; an info that cannot be written (a circular reference, nesting too
    deep) is replaced by a note naming why, so one env's info never loses the call's other rollouts."""
    try:
        return json.dumps(rollout_to_dict(rollout))
    except (ValueError, TypeError, RecursionError) as exc:
        log.warning("rollout %s: info not writable as JSON (%s); written without it", rollout.id, exc)
        note = {"info_unwritable": f"{type(exc).__name__}: {exc}"}
        steps = [_with_info(step, note) for step in rollout.steps]
        meta = {key: _writable(value) for key, value in {**rollout.meta, **note}.items()}
        return json.dumps(rollout_to_dict(Rollout(id=rollout.id, steps=steps, meta=meta)))


def _writable(value: Any) -> Any:
    """``value`` if it can be written as JSON, else a note naming its type."""
    try:
        json.dumps(rollout_to_dict(Rollout(meta={"v": value})))
    except (ValueError, TypeError, RecursionError):
        return f"<{type(value).__name__} not writable as JSON>"
    return value


def _with_info(step: Step, info: dict[str, Any]) -> Step:
    return Step(
        index=step.index, prev_obs=step.prev_obs, action=step.action, next_obs=step.next_obs,
        reward=step.reward, truncated=step.truncated, terminated=step.terminated, info=dict(info),
        trace=step.trace, tool_traces=list(step.tool_traces),
    )  # fmt: skip
