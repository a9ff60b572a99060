"""Trainer set-up kept out of the training loop: checks, seeding, model, optimizer, scheduler, forward."""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from ludic.distributed.interfaces import PolicyPublisher
from ludic.training.config import TrainerConfig
from ludic.training.schedule import build_lr_scheduler


def seed_everything(seed: int | None) -> None:
    """Seed Python, NumPy and torch (None: leave them as they are)."""
    if seed is None:
        return
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_publisher(cfg: TrainerConfig, publisher: PolicyPublisher | None) -> None:
    """Refuse ``sync_every_steps`` set explicitly without a publisher to sync with."""
    if publisher is None and cfg.sync_explicit and cfg.sync_every_steps > 0:
        raise ValueError(
            f"TrainerConfig.sync_every_steps={cfg.sync_every_steps} but no publisher was given; pass "
            "publisher=ClientPublisher(client) (ludic.distributed) or set sync_every_steps=0"
        )


def prepare_model(model: nn.Module, cfg: TrainerConfig, *, sharded: bool) -> nn.Module:
    """The model in training mode on ``cfg.model_device`` (a sharded one stays where FSDP put it),
    with activation checkpointing when ``cfg.gradient_checkpointing``."""
    if not sharded:
        model = model.to(cfg.model_device)
    if cfg.gradient_checkpointing:
        enable_gradient_checkpointing(model)
    model.train()
    return model


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


def check_optimizer_settings(
    cfg: TrainerConfig, optimizer: torch.optim.Optimizer | None, lr_scheduler: LRScheduler | None
) -> None:
    """Refuse settings that would be silently ignored: one place for each number."""
    if optimizer is not None and cfg.optimizer_fields_set():
        raise ValueError(
            f"Trainer got optimizer= and TrainerConfig {cfg.optimizer_fields_set()} set; those build the "
            "default AdamW and would be ignored. Set them on your optimizer, or drop optimizer= and let "
            "the Trainer build AdamW from the config"
        )
    if lr_scheduler is not None and (cfg.lr_schedule != "constant" or cfg.warmup_steps):
        raise ValueError(
            f"Trainer got lr_scheduler= and TrainerConfig.lr_schedule={cfg.lr_schedule!r}, "
            f"warmup_steps={cfg.warmup_steps}; pass one of them"
        )


def build_cfg_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainerConfig) -> LRScheduler | None:
    """The scheduler named by ``cfg.lr_schedule`` (None for a constant rate without warm-up)."""
    return build_lr_scheduler(
        optimizer, cfg.lr_schedule, warmup_steps=cfg.warmup_steps, total_steps=cfg.total_steps
    )


def resolve_pad_token_id(model: nn.Module, cfg: TrainerConfig) -> int:
    """``cfg.pad_token_id``, else the model config's pad token, else its eos token, else 0.

    Padded positions are masked out of attention and of the loss, so the id only has to be one the
    embedding accepts; the model's own pad id is the one its tokenizer uses. A model with neither
    (a bare ``nn.Module``, a config without token ids) pads with 0.
    """
    if cfg.pad_token_id is not None:
        return cfg.pad_token_id
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None)
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(config, name, None)
        if isinstance(value, list) and value:
            value = value[0]
        if isinstance(value, int) and value >= 0 and (not isinstance(vocab, int) or value < vocab):
            return value
    return 0


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
