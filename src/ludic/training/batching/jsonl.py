"""JSON (de)serialisation of rollouts and SAW items, one object per line, streamed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ludic.training.types import ActorTokenLogps, SampleAttachments, SAWItem
from ludic.types import Rollout, Step, TokenTrace


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, tuple)):
        return list(value)
    return repr(value)  # objects in info/meta are kept as their repr rather than failing the write


def dumps(record: dict[str, Any]) -> str:
    return json.dumps(record, default=_json_default)


def rollout_to_dict(rollout: Rollout) -> dict[str, Any]:
    return json.loads(
        dumps(
            {
                "kind": "rollout",
                "id": rollout.id,
                "meta": rollout.meta,
                "steps": [
                    {
                        "index": s.index,
                        "prev_obs": s.prev_obs,
                        "action": s.action,
                        "next_obs": s.next_obs,
                        "reward": s.reward,
                        "truncated": s.truncated,
                        "terminated": s.terminated,
                        "info": s.info,
                        "trace": None if s.trace is None else vars(s.trace),
                        "tool_traces": [None if t is None else vars(t) for t in s.tool_traces],
                    }
                    for s in rollout.steps
                ],
            }
        )
    )


def rollout_from_dict(data: dict[str, Any]) -> Rollout:
    steps = []
    for s in data.get("steps", []):
        trace = TokenTrace(**s["trace"]) if s.get("trace") else None
        steps.append(
            Step(
                s["index"], s["prev_obs"], s["action"], s["next_obs"], s["reward"],
                s["truncated"], s["terminated"], s.get("info", {}), trace,
                [TokenTrace(**t) if t else None for t in s.get("tool_traces", [])],
            )
        )  # fmt: skip
    return Rollout(id=data["id"], steps=steps, meta=data.get("meta", {}))


def saw_item_to_dict(item: SAWItem) -> dict[str, Any]:
    actor = item.attachments.actor_logps
    return json.loads(
        dumps(
            {
                "kind": "saw_item",
                "input_ids": item.input_ids,
                "attention_mask": item.attention_mask,
                "action_mask": item.action_mask,
                "weight": item.weight,
                "meta": item.meta,
                "actor_logps": None if actor is None else actor.token_logps,
                "frozen_logps": item.attachments.frozen_logps,
                "token_weights": item.token_weights,
            }
        )
    )


def saw_item_from_dict(data: dict[str, Any]) -> SAWItem:
    missing = [k for k in ("input_ids", "action_mask") if k not in data]
    if missing:
        raise KeyError(f"SAW item record lacks {missing}; got keys {sorted(data)}")
    actor, token_weights = data.get("actor_logps"), data.get("token_weights")
    return SAWItem(
        input_ids=list(data["input_ids"]),
        attention_mask=list(data.get("attention_mask") or [1] * len(data["input_ids"])),
        action_mask=list(data["action_mask"]),
        weight=float(data.get("weight", 1.0)),
        meta=dict(data.get("meta") or {}),
        attachments=SampleAttachments(
            ActorTokenLogps(list(actor)) if actor is not None else None,
            {str(k): [float(x) for x in v] for k, v in (data.get("frozen_logps") or {}).items()},
        ),
        token_weights=None if token_weights is None else list(token_weights),
    )


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield one dict per non-empty line, never holding the file in memory; errors name file and line."""
    for _, record in iter_jsonl_numbered(path):
        yield record


def iter_jsonl_numbered(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """``(line_number, record)`` per non-empty line (1-based), so later errors can name file:line."""
    with Path(path).open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc


def write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(dumps(record) + "\n")
