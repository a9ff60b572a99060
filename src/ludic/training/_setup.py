"""Trainer set-up kept out of the training loop: seeding, optimizer, gradient checkpointing, forward."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn

from ludic.training.config import TrainerConfig


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def trainable_parameters(model: nn.Module) -> list[nn.Parameter]:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError(
            f"{type(model).__name__} has no parameters with requires_grad=True; nothing to train"
        )
    return params


def build_optimizer(model: nn.Module, cfg: TrainerConfig) -> torch.optim.Optimizer:
    """AdamW over the trainable parameters (LoRA adapters only, for a peft model)."""
    return make_adamw(trainable_parameters(model), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=cfg.betas)


def make_adamw(params: Iterable[nn.Parameter], **kwargs: Any) -> torch.optim.AdamW:
    """AdamW, with the fused kernel (one op for all tensors) where torch has it for these parameters."""
    params = list(params)
    devices = {p.device.type for p in params}
    fused = devices <= {"cpu", "cuda"} and len(devices) == 1 and all(p.is_floating_point() for p in params)
    return torch.optim.AdamW(params, fused=fused or None, **kwargs)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Turn on HF activation checkpointing; peft models also need inputs that require grad."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x spelling
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    elif hasattr(model, "gradient_checkpointing_enable"):
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    else:
        raise ValueError(
            f"gradient_checkpointing=True but {type(model).__name__} has no gradient_checkpointing_enable(); "
            "use a transformers model or set TrainerConfig.gradient_checkpointing=False"
        )
    if hasattr(model, "enable_input_require_grads"):
        model.enable_input_require_grads()
    if getattr(model, "config", None) is not None and hasattr(model.config, "use_cache"):
        model.config.use_cache = False


def forward_logits(model: nn.Module, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """``[B, T, V]`` logits for a collated micro-batch (HF output objects or plain tensors)."""
    kwargs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    if getattr(model, "config", None) is not None:
        kwargs["use_cache"] = False  # no KV cache while training
    out = model(**kwargs)
    logits = out.logits if hasattr(out, "logits") else out
    if not torch.is_tensor(logits) or logits.dim() != 3:
        raise TypeError(f"model forward must give [B, T, V] logits, got {type(logits).__name__}")
    return logits
