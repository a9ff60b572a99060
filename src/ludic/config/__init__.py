"""Run configs for ``ludic train`` / ``ludic eval``: schema, loading and validation."""

from ludic.config.load import load_config, parse_config, read_config_file
from ludic.config.schema import (
    AlgorithmSection,
    ComponentSection,
    EvalSection,
    HarnessSection,
    InferenceSection,
    LoggingSection,
    ModelSection,
    ProtocolSection,
    RolloutSection,
    RunConfig,
    SamplingSection,
)
from ludic.config.validate import ConfigError, build_dataclass

__all__ = [
    "AlgorithmSection",
    "ComponentSection",
    "ConfigError",
    "EvalSection",
    "HarnessSection",
    "InferenceSection",
    "LoggingSection",
    "ModelSection",
    "ProtocolSection",
    "RolloutSection",
    "RunConfig",
    "SamplingSection",
    "build_dataclass",
    "load_config",
    "parse_config",
    "read_config_file",
]
