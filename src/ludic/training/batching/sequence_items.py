"""A multi-turn rollout as one training sequence (``RolloutEngine(one_sequence=True)``).

Per-step items re-send the whole history as each step's prompt, so an episode of T turns costs
O(T^2) prompt tokens. When every model call's prompt ids begin with the previous call's prompt +
completion ids (agents built with ``Agent(exact_sequence=True)`` make them so), the calls of a
rollout are one sequence: ``input_ids`` = the last call's prompt + completion, ``action_mask`` 1 on
each call's sampled completion and 0 on everything else (templates, env observations, tool results),
actor log-probs concatenated in order. Each call's action span carries its step's credit: where the
credit differs between calls (per-turn credit, ``PerTurnReturn``), the item gets ``token_weights``
(one per action token, its call's weight; ``weight`` is then their mean, a summary); where it is
the same throughout, the plain scalar ``weight``. Where the ids do not extend (a template that
rewrote history), or a call was sampled with other settings than the one before it (the trainer
divides an item's logits by one temperature), a new item starts. Each item is exactly the union of the per-step items it
replaces: for a loss that sums over action tokens with per-token advantages (REINFORCE without the
sequence ratio, token-level PPO/GRPO clip, CISPO, SFT) its gradient is the sum of theirs. Losses
with a sequence-level ratio (REINFORCE's IS correction, GSPO) take one ratio over the whole episode
instead of one per call; on-policy the ratios are 1 either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ludic.training.batching.saw_builder import step_to_saw_item
from ludic.training.types import ActorTokenLogps, RolloutStepKey, SampleAttachments, SAWItem
from ludic.types import Rollout, Step, TokenTrace


@dataclass
class _Segment:
    first: Step
    last: Step
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logps: list[float] | None = field(default_factory=list)
    token_weights: list[float] = field(default_factory=list)
    call_weights: list[float] = field(default_factory=list)
    calls: int = 0
    steps: list[int] = field(default_factory=list)


def rollout_to_sequence_items(rollout: Rollout, weights: Mapping[RolloutStepKey, float]) -> list[SAWItem]:
    """The rollout's model calls merged into as few sequences as the ids allow."""
    items: list[SAWItem] = []
    seg: _Segment | None = None
    for step in rollout.steps:
        key = (rollout.id, step.index)
        if key not in weights:
            raise KeyError(f"credit assigner gave no weight for rollout {rollout.id!r} step {step.index}")
        for trace in [*step.tool_traces, step.trace]:
            if trace is None:
                raise ValueError(
                    f"missing rollout-time token trace for rollout {rollout.id!r} step {step.index}: the "
                    "client must return prompt/completion token ids (Ludic never re-tokenises generated text)"
                )
            if seg is not None and not (_extends(seg.ids, trace) and _same_sampling(seg.last, step)):
                items.append(_item(rollout, seg))
                seg = None
            if seg is None:
                seg = _Segment(first=step, last=step)
            _append(seg, step, trace, float(weights[key]))
    if seg is not None:
        items.append(_item(rollout, seg))
    return items


def rollouts_to_sequence_items(
    rollouts: Sequence[Rollout], weights: Mapping[RolloutStepKey, float]
) -> list[SAWItem]:
    return [item for rollout in rollouts for item in rollout_to_sequence_items(rollout, weights)]


def _extends(ids: list[int], trace: TokenTrace) -> bool:
    prompt = trace.prompt_token_ids
    return len(prompt) >= len(ids) and prompt[: len(ids)] == ids


SAMPLING_KEYS = ("sampling_temperature", "sampling_top_p")
"""Step info that fixes how an item's log-probs are recomputed: one value per item."""


def _same_sampling(previous: Step, step: Step) -> bool:
    return all(previous.info.get(key) == step.info.get(key) for key in SAMPLING_KEYS)


def _append(seg: _Segment, step: Step, trace: TokenTrace, weight: float) -> None:
    new_prompt = trace.prompt_token_ids[len(seg.ids) :]
    completion = list(trace.completion_token_ids)
    seg.ids += [*new_prompt, *completion]
    seg.mask += [0] * len(new_prompt) + [1] * len(completion)
    seg.token_weights += [weight] * len(completion)
    seg.call_weights.append(weight)
    if seg.logps is not None and trace.completion_logprobs is not None:
        seg.logps += [float(x) for x in trace.completion_logprobs]
    else:
        seg.logps = None
    seg.last = step
    seg.calls += 1
    if step.index not in seg.steps:
        seg.steps.append(step.index)


def _item(rollout: Rollout, seg: _Segment) -> SAWItem:
    uniform = len(set(seg.call_weights)) == 1
    if uniform:
        weight, token_weights = seg.call_weights[0], None
    else:  # per-call credit: each action token carries its call's weight; `weight` summarises them
        weight = sum(seg.token_weights) / len(seg.token_weights) if seg.token_weights else 0.0
        token_weights = seg.token_weights
    template = step_to_saw_item(rollout, seg.last, weight)  # the last step's meta (env results)
    meta: dict[str, Any] = {
        **template.meta,
        "step_index": seg.first.index,
        "step_indices": list(seg.steps),
        "num_calls": seg.calls,
        "one_sequence": True,
        "prompt_length": seg.mask.index(1) if 1 in seg.mask else len(seg.mask),
        "completion_length": sum(seg.mask),
    }
    actor = ActorTokenLogps(seg.logps) if seg.logps is not None else None
    return SAWItem(
        input_ids=seg.ids,
        attention_mask=[1] * len(seg.ids),
        action_mask=seg.mask,
        weight=float(weight),
        meta=meta,
        attachments=SampleAttachments(actor_logps=actor),
        token_weights=token_weights,
    )
