"""``--set section.key=value`` and ``--output-dir``: command-line changes to a config's data, applied before
validation so an override is checked exactly as the same key written in the file would be."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ludic.config.errors import ConfigError

__all__ = ["apply_overrides", "parse_override", "set_output_dir"]


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"rollout.sampling.temperature=0.5"`` -> (["rollout", "sampling", "temperature"], 0.5).

    The value is read as a TOML value (``3``, ``1e-4``, ``true``, ``"a b"``, ``[1, 2]``, ``{ project = "x" }``);
    text that is not one (``runs/x``, ``grpo``) is taken as a string.
    """
    key, sep, raw = text.partition("=")
    parts = [p.strip() for p in key.split(".")]
    if not sep or not all(parts):
        raise ConfigError(
            [f"--set {text!r}: expected section.key=value (e.g. --set trainer.lr=1e-5 or --set steps=20)"]
        )
    raw = raw.strip()
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    return parts, value


def apply_overrides(data: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """A copy of ``data`` with each ``--set`` applied in order (tables are created as needed). Only the tables
    on an override's path are copied: the rest, however deep, is left to the depth check of validation."""
    out = dict(data)
    for text in overrides:
        keys, value = parse_override(text)
        table = out
        for i, key in enumerate(keys[:-1]):
            nested = table.get(key, {})
            if not isinstance(nested, Mapping):
                where = ".".join(keys[: i + 1])
                raise ConfigError([f"--set {text!r}: {where} is {nested!r:.60}, not a table"])
            table[key] = table = dict(nested)
        table[keys[-1]] = value
    return out


def set_output_dir(data: Mapping[str, Any], output_dir: str) -> dict[str, Any]:
    """``--output-dir``: ``[logging].output_dir``; a ``[checkpoint].output_dir`` that lay under the old one
    moves with it (by default it is ``<output_dir>/checkpoints``), one elsewhere stays where the file says."""
    out = dict(data)
    logging = out.get("logging", {})
    if not isinstance(logging, Mapping):
        raise ConfigError([f"--output-dir: [logging] is {logging!r:.60}, not a table"])
    out["logging"] = logging = dict(logging)
    old = Path(str(logging.get("output_dir", "runs/ludic")))
    logging["output_dir"] = output_dir
    ckpt = out.get("checkpoint")
    if isinstance(ckpt, Mapping) and isinstance(ckpt.get("output_dir"), str):
        path = Path(ckpt["output_dir"])
        if path == old or old in path.parents:
            out["checkpoint"] = {**ckpt, "output_dir": str(Path(output_dir) / path.relative_to(old))}
    return out
