"""Training: credit assignment, losses, presets, batching, the Trainer, stats, loggers, checkpoints."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.training.algorithm import RLAlgorithm, validate_actor_logps
    from ludic.training.batching import (
        GRPORequestStrategy,
        OfflineBatchSource,
        RolloutBatchSource,
        RolloutEngine,
        sft_item,
        sft_items,
    )
    from ludic.training.checkpoint.manager import CheckpointManager
    from ludic.training.config import CheckpointConfig, TrainerConfig
    from ludic.training.credit.assigners import (
        ConstantCredit,
        EpisodicReturn,
        GroupNormalizedReturn,
        HybridNormalizedReturn,
        MonteCarloReturn,
        PerStepReward,
    )
    from ludic.training.credit.per_turn import PerTurnReturn
    from ludic.training.loggers import JsonlLogger, PrintLogger, RichLiveLogger, TeeLogger, TrainingLogger
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
    from ludic.training.pipeline import PipelineBatchSource, run_pipeline_actor
    from ludic.training.presets import (
        build_preset,
        make_cispo,
        make_grpo,
        make_gspo,
        make_reinforce,
        make_reinforce_baseline,
        make_scalerl,
        make_sft,
    )
    from ludic.training.reference.distill import make_distill
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
    from ludic.training.wiring import SeededRequests, online_trainer, seeded_episode, sft_trainer

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
    "PerTurnReturn",
    "PipelineBatchSource",
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
    "SeededRequests",
    "TeeLogger",
    "TokenClippedSurrogateLoss",
    "TokenKLLoss",
    "Trainer",
    "TrainerConfig",
    "TrainingLogger",
    "aggregate_stats",
    "apply_reducers_to_records",
    "build_preset",
    "default_reducers",
    "make_cispo",
    "make_distill",
    "make_grpo",
    "make_gspo",
    "make_reinforce",
    "make_reinforce_baseline",
    "make_scalerl",
    "make_sft",
    "online_trainer",
    "run_pipeline_actor",
    "seeded_episode",
    "sft_item",
    "sft_items",
    "sft_trainer",
    "validate_actor_logps",
]

__getattr__, __dir__ = lazy_exports(__name__)
