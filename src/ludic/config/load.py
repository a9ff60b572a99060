"""Read a TOML or YAML run config and validate all of it before anything is built."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ludic.config.errors import ConfigError, format_errors, key_path
from ludic.config.schema import RunConfig


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse ``path`` as TOML (``.toml``) or YAML (``.yaml``/``.yml``) into plain data."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: no such file"])
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            data = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text)
            data = {} if data is None else data
        else:
            raise ConfigError(
                [f"{path.name}: unsupported config format {suffix!r}; use .toml, .yaml or .yml"]
            )
    except ConfigError:
        raise
    except Exception as exc:  # tomllib.TOMLDecodeError, yaml.YAMLError
        raise ConfigError([f"{path.name}: cannot parse: {exc}"]) from exc
    if not isinstance(data, Mapping):
        raise ConfigError([f"{path.name}: top level must be a table, got {type(data).__name__}"])
    return dict(data)


_PLAIN = (str, int, float, bool, type(None))


def _unsupported(data: Any, keys: tuple[str, ...] = ()) -> list[str]:
    """``[a.b].c: ...`` for every value JSON cannot hold (TOML/YAML dates and times)."""
    if isinstance(data, Mapping):
        return [line for k, v in data.items() for line in _unsupported(v, (*keys, str(k)))]
    if isinstance(data, (list, tuple)):
        return [line for v in data for line in _unsupported(v, keys)]
    if isinstance(data, _PLAIN):
        return []
    where = key_path(".".join(keys[:-1]), keys[-1]) if keys else "top level"
    return [f"{where}: {type(data).__name__} values are not supported; quote it ({str(data)!r})"]


def _as_json(data: Mapping[str, Any], file: str) -> str:
    """Config data as JSON text: pydantic's strict JSON mode reads lists as tuples and strings as paths."""
    bad = _unsupported(data)
    if bad:
        raise ConfigError([f"{file}: {line}" for line in bad])
    try:
        return json.dumps(data)
    except (TypeError, ValueError) as exc:  # e.g. a YAML key that is itself a list
        raise ConfigError([f"{file}: {exc}"]) from exc


def _checkpoint_dir_default(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``[checkpoint].output_dir`` defaults to ``<logging.output_dir>/checkpoints``."""
    ckpt = data.get("checkpoint")
    if not isinstance(ckpt, Mapping) or "output_dir" in ckpt:
        return data
    logging = data.get("logging")
    out = logging.get("output_dir") if isinstance(logging, Mapping) else None
    out = out if isinstance(out, str) else "runs/ludic"
    return {**data, "checkpoint": {"output_dir": str(Path(out) / "checkpoints"), **ckpt}}


def parse_config(data: Mapping[str, Any], *, file: str = "<config>") -> RunConfig:
    """Validate plain data into a :class:`RunConfig` (``trainer``/``checkpoint`` built too).

    Validation runs in pydantic's strict JSON mode (no model validator may run ``mode="before"``:
    that would switch nested tables to Python mode, where a list is no longer a tuple).
    """
    try:
        cfg = RunConfig.model_validate_json(_as_json(_checkpoint_dir_default(data), file), strict=True)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, RunConfig, file=file)) from None
    cfg._source = file
    return cfg


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a run config; raises :class:`ConfigError` listing every problem."""
    path = Path(path)
    return parse_config(read_config_file(path), file=path.name)
