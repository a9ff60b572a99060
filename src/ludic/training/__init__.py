"""Training: credit assignment, losses, presets, batching, the Trainer, stats, loggers, checkpoints."""

from ludic.training.algorithm import RLAlgorithm, validate_actor_logps
from ludic.training.batching import (
    GRPORequestStrategy,
    OfflineBatchSource,
    RolloutBatchSource,
    RolloutEngine,
)
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
from ludic.training.presets import (
    make_cispo,
    make_grpo,
    make_gspo,
    make_reinforce,
    make_reinforce_baseline,
    make_scalerl,
    make_sft,
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
    "GRPORequestStrategy",
    "GroupNormalizedReturn",
    "HybridNormalizedReturn",
    "JsonlLogger",
    "Loss",
    "LossTerm",
    "MaskedCausalLMCrossEntropyLoss",
    "MonteCarloReturn",
    "OfflineBatchSource",
    "PerStepReward",
    "PrintLogger",
    "ProtocolSpec",
    "RLAlgorithm",
    "Reducer",
    "ReinforceBaselineLoss",
    "ReinforceLoss",
    "RichLiveLogger",
    "RolloutBatchSource",
    "RolloutEngine",
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
    "make_cispo",
    "make_grpo",
    "make_gspo",
    "make_reinforce",
    "make_reinforce_baseline",
    "make_scalerl",
    "make_sft",
    "validate_actor_logps",
]
