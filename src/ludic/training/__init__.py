"""Training: credit assignment, losses, presets, batching, the Trainer, stats, loggers, checkpoints."""

from ludic.training.algorithm import RLAlgorithm
from ludic.training.checkpoint import CheckpointManager
from ludic.training.config import CheckpointConfig, TrainerConfig
from ludic.training.credit_assignment import (
    ConstantCredit,
    EpisodicReturn,
    GroupNormalizedReturn,
    HybridNormalizedReturn,
    MonteCarloReturn,
    PerStepReward,
)
from ludic.training.loggers import JsonlLogger, PrintLogger, RichLiveLogger, TeeLogger
from ludic.training.loss import (
    CISPOLoss,
    ClippedSurrogateLoss,
    CompositeLoss,
    Loss,
    LossTerm,
    MaskedCausalLMCrossEntropyLoss,
    ReinforceBaselineLoss,
    ReinforceLoss,
    TokenClippedSurrogateLoss,
    TokenKLLoss,
)
from ludic.training.stats import Reducer, aggregate_stats, apply_reducers_to_records, default_reducers
from ludic.training.trainer import Trainer
from ludic.training.types import (
    ActorTokenLogps,
    BatchSource,
    CreditAssigner,
    EnvSpec,
    ProtocolSpec,
    RolloutRequest,
    RolloutStepKey,
    SampleAttachments,
    SAWBatch,
    SAWItem,
)

__all__ = [
    "ActorTokenLogps",
    "BatchSource",
    "CISPOLoss",
    "CheckpointConfig",
    "CheckpointManager",
    "ClippedSurrogateLoss",
    "CompositeLoss",
    "ConstantCredit",
    "CreditAssigner",
    "EnvSpec",
    "EpisodicReturn",
    "GroupNormalizedReturn",
    "HybridNormalizedReturn",
    "JsonlLogger",
    "Loss",
    "LossTerm",
    "MaskedCausalLMCrossEntropyLoss",
    "MonteCarloReturn",
    "PerStepReward",
    "PrintLogger",
    "ProtocolSpec",
    "RLAlgorithm",
    "Reducer",
    "ReinforceBaselineLoss",
    "ReinforceLoss",
    "RichLiveLogger",
    "RolloutRequest",
    "RolloutStepKey",
    "SAWBatch",
    "SAWItem",
    "SampleAttachments",
    "TeeLogger",
    "TokenClippedSurrogateLoss",
    "TokenKLLoss",
    "Trainer",
    "TrainerConfig",
    "aggregate_stats",
    "apply_reducers_to_records",
    "default_reducers",
]
