"""Read a TOML or YAML run config and validate all of it before anything is built."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ludic.config.errors import ConfigError, format_errors, key_path
from ludic.config.limits import MAX_CONFIG_DEPTH, check_depth, check_toml_depth
from ludic.config.overrides import apply_overrides, set_output_dir
from ludic.config.schema import RunConfig
from ludic.config.yaml_reader import MAX_CONFIG_NODES, yaml_load

__all__ = ["MAX_CONFIG_BYTES", "MAX_CONFIG_DEPTH", "MAX_CONFIG_NODES", "load_config", "parse_config"]

MAX_CONFIG_BYTES = 1 << 20
"""A run config is a page of settings; anything larger is refused before parsing."""


def _read_text(path: Path) -> str:
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError(
            [f"{path.name}: {size} bytes is too large for a run config (limit {MAX_CONFIG_BYTES})"]
        )
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(
            [f"{path.name}: not UTF-8 text: byte 0x{raw[exc.start]:02x} at line {line} (offset {exc.start}); "
             "save the file as UTF-8"]
        ) from None  # fmt: skip


def _parse_toml(text: str, name: str) -> dict[str, Any]:
    check_toml_depth(text, name)  # tomllib recurses per nested array: bound it first
    return tomllib.loads(text)


def read_config_file(path: str | Path) -> dict[str, Any]:
    """Parse ``path`` as TOML (``.toml``) or YAML (``.yaml``/``.yml``) into plain data."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: no such file"])
    suffix = path.suffix.lower()
    if suffix not in (".toml", ".yaml", ".yml"):
        raise ConfigError([f"{path.name}: unsupported config format {suffix!r}; use .toml, .yaml or .yml"])
    text = _read_text(path)
    try:
        data = _parse_toml(text, path.name) if suffix == ".toml" else yaml_load(text, path.name)
    except ConfigError:
        raise
    except RecursionError:
        raise ConfigError(
            [f"{path.name}: nested too deeply to parse (a config may nest at most {MAX_CONFIG_DEPTH} levels)"]
        ) from None
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
    check_depth(data, file)
    bad = _unsupported(data)
    if bad:
        raise ConfigError([f"{file}: {line}" for line in bad])
    try:
        return json.dumps(data)
    except (TypeError, ValueError) as exc:  # e.g. a YAML key that is itself a list
        raise ConfigError([f"{file}: {exc}"]) from exc


def _derived_defaults(data: Mapping[str, Any], file: str) -> Mapping[str, Any]:
    """Keys that one setting feeds into another table, so each is set once and takes effect.

    ``[checkpoint].output_dir`` defaults to ``<logging.output_dir>/checkpoints``;
    ``[trainer].model_device`` follows ``[model].device`` and ``[trainer].eval_every_n_steps``
    follows ``[eval].every_n_steps``; both spelled out and different is an error.
    """
    data = dict(data)
    model, trainer, evals = (data.get(k) for k in ("model", "trainer", "eval"))
    trainer = dict(trainer) if isinstance(trainer, Mapping) else ({} if trainer is None else trainer)
    errors = []
    pairs = [("device", model, "model_device"), ("every_n_steps", evals, "eval_every_n_steps")]
    for source_key, source, trainer_key in pairs:
        if not isinstance(source, Mapping) or source_key not in source or not isinstance(trainer, dict):
            continue
        table = "model" if source is model else "eval"
        value = source[source_key] if table == "model" or source[source_key] else None
        if trainer_key not in trainer:
            trainer[trainer_key] = value
        elif trainer[trainer_key] != value:
            errors.append(
                f"{file}: [trainer].{trainer_key} = {trainer[trainer_key]!r} contradicts "
                f"[{table}].{source_key} = {source[source_key]!r}; set only [{table}].{source_key}"
            )
    if errors:
        raise ConfigError(errors)
    if isinstance(trainer, dict) and (trainer or "trainer" in data):
        data["trainer"] = trainer
    ckpt = data.get("checkpoint")
    if isinstance(ckpt, Mapping) and "output_dir" not in ckpt:
        logging = data.get("logging")
        out = logging.get("output_dir") if isinstance(logging, Mapping) else None
        out = out if isinstance(out, str) else "runs/ludic"
        data["checkpoint"] = {"output_dir": str(Path(out) / "checkpoints"), **ckpt}
    return data


def parse_config(data: Mapping[str, Any], *, file: str = "<config>") -> RunConfig:
    """Validate plain data into a :class:`RunConfig` (``trainer``/``manager`` built too).

    Validation runs in pydantic's strict JSON mode (no model validator may run ``mode="before"``:
    that would switch nested tables to Python mode, where a list is no longer a tuple).
    """
    try:
        cfg = RunConfig.model_validate_json(_as_json(_derived_defaults(data, file), file), strict=True)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, RunConfig, file=file)) from None
    cfg._source = file
    return cfg


def load_config(
    path: str | Path, overrides: Sequence[str] = (), *, output_dir: str | None = None
) -> RunConfig:
    """Read and validate a run config; raises :class:`ConfigError` listing every problem.

    overrides: ``section.key=value`` changes (``--set``); output_dir: ``--output-dir`` (``ludic.config.overrides``).
    """
    path = Path(path)
    data = read_config_file(path)
    if output_dir is not None:
        data = set_output_dir(data, output_dir)
    cfg = parse_config(apply_overrides(data, overrides), file=path.name)
    cfg._folder = str(path.parent)
    return cfg
