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


def check_token_ids(name: str, values: Any, vocab_size: int | None = None) -> None:
    """ValueError unless ``values`` is a list of ints in ``[0, vocab_size)`` (``>= 0`` if unknown).

    Offline data is checked as it is read, so a bad id (``"abcd"``, -1, 1e30, 5.5) is reported with its
    file and line instead of surfacing later as an IndexError in the embedding.
    """
    if not isinstance(values, list):
        raise ValueError(f"{name} must be a list of token ids, got {type(values).__name__}")
    for i, tok in enumerate(values):
        if not isinstance(tok, int) or isinstance(tok, bool):
            raise ValueError(f"{name}[{i}] = {tok!r:.40} is not an int token id")
        if tok < 0 or (vocab_size is not None and tok >= vocab_size):
            bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
            raise ValueError(f"{name}[{i}] = {tok} is out of range (token ids must be {bound})")


def _trace_from_dict(data: Any) -> TokenTrace:
    if not isinstance(data, dict):
        raise ValueError(f"a token trace must be a JSON object, got {type(data).__name__}")
    trace = TokenTrace(**data)
    check_token_ids("prompt_token_ids", trace.prompt_token_ids)
    check_token_ids("completion_token_ids", trace.completion_token_ids)
    return trace


def rollout_from_dict(data: dict[str, Any]) -> Rollout:
    steps = []
    for s in data.get("steps", []):
        trace = _trace_from_dict(s["trace"]) if s.get("trace") else None
        steps.append(
            Step(
                s["index"], s["prev_obs"], s["action"], s["next_obs"], s["reward"],
                s["truncated"], s["terminated"], s.get("info", {}), trace,
                [_trace_from_dict(t) if t else None for t in s.get("tool_traces", [])],
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
    check_token_ids("input_ids", data["input_ids"])
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
    """``(line_number, record)`` per non-empty line (1-based), so later errors can name file:line.

    Each line must be UTF-8 text holding one JSON object; anything else (a list, ``null``, bytes that are
    not UTF-8) is a ValueError naming the file and line. A UTF-8 byte-order mark at the start of the file
    (editors on Windows write one) is skipped, as the ``dataset_qa`` rows reader does.
    """
    with Path(path).open("rb") as f:  # bytes, so a bad line is reported with its number
        for lineno, raw in enumerate(f, start=1):
            if lineno == 1:
                raw = raw.removeprefix(b"\xef\xbb\xbf")
            record = _parse_line(path, lineno, raw)
            if record is not None:
                yield lineno, record


def _json_type(value: Any) -> str:
    names = {type(None): "null", bool: "boolean", list: "array", str: "string", int: "number"}
    return names.get(type(value), "number" if isinstance(value, float) else type(value).__name__)


def _parse_line(path: str | Path, lineno: int, raw: bytes) -> dict[str, Any] | None:
    """The JSON object on one line; ``None`` for a blank line."""
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}:{lineno}: not UTF-8 text (byte {exc.start}: {exc.reason})") from exc
    if not line.strip():
        return None
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from exc
    if not isinstance(record, dict):
        raise ValueError(f"{path}:{lineno}: expected a JSON object per line, got {_json_type(record)}")
    return record


def write_jsonl(path: str | Path, records: list[dict[str, Any]]) -> None:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("w", encoding="utf-8") as f:
        for record in records:
            f.write(dumps(record) + "\n")
