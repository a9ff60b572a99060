"""Run configs for ``ludic train`` / ``ludic eval``: schema, loading and validation."""

from ludic.config.errors import ConfigError
from ludic.config.load import load_config, parse_config, read_config_file
from ludic.config.schema import (
    AlgorithmSection,
    ComponentSection,
    EnvSection,
    EvalSection,
    HarnessSection,
    InferenceSection,
    LoggingSection,
    ModelSection,
    PipelineSection,
    ProtocolSection,
    RolloutSection,
    RunConfig,
    SamplingSection,
    Section,
)

__all__ = [
    "AlgorithmSection",
    "ComponentSection",
    "ConfigError",
    "EnvSection",
    "EvalSection",
    "HarnessSection",
    "InferenceSection",
    "LoggingSection",
    "ModelSection",
    "PipelineSection",
    "ProtocolSection",
    "RolloutSection",
    "RunConfig",
    "SamplingSection",
    "Section",
    "load_config",
    "parse_config",
    "read_config_file",
]
