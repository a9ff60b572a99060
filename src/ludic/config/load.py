"""Read a TOML or YAML run config and validate all of it before anything is built."""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ludic.config.schema import RunConfig
from ludic.config.validate import ConfigError, build_dataclass

# Tables checked against the component's own config dataclass: table -> "module:Class".
COMPONENT_CONFIGS = {
    "trainer": "ludic.training.config:TrainerConfig",
    "checkpoint": "ludic.training.config:CheckpointConfig",
}


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


def _component_class(target: str) -> type:
    module, attr = target.split(":")
    return getattr(importlib.import_module(module), attr)


def parse_config(data: Mapping[str, Any], *, file: str = "<config>") -> RunConfig:
    """Validate plain data into a :class:`RunConfig` (``trainer``/``checkpoint`` built too)."""
    data = dict(data)
    errors: list[str] = []
    built: dict[str, Any] = {}
    for table, target in COMPONENT_CONFIGS.items():
        raw = data.pop(table, None)
        if raw is None and table == "checkpoint":
            continue
        raw = {} if raw is None else raw
        if table == "checkpoint" and isinstance(raw, Mapping) and "output_dir" not in raw:
            out = data.get("logging", {}).get("output_dir", "runs/ludic")
            raw = {"output_dir": str(Path(out) / "checkpoints"), **raw}
        try:
            built[table] = build_dataclass(_component_class(target), raw, file=file, section=table)
        except ConfigError as exc:
            errors.extend(exc.errors)
    try:
        cfg = build_dataclass(RunConfig, data, file=file)
    except ConfigError as exc:
        errors.extend(exc.errors)
        cfg = None
    if errors or cfg is None:
        raise ConfigError(errors)
    cfg.trainer = built["trainer"]
    cfg.checkpoint = built.get("checkpoint")
    cfg.source = file
    return cfg


def load_config(path: str | Path) -> RunConfig:
    """Read and validate a run config; raises :class:`ConfigError` listing every problem."""
    path = Path(path)
    return parse_config(read_config_file(path), file=path.name)
