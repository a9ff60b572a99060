"""A peft LoRA model whose adapters are non-zero, as after training (a fresh adapter's B is zero, so it
would change nothing and a test of adapter serving would pass vacuously)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def trained_lora_model(
    model_dir: str | Path, targets: list[str], *, seed: int, scale: float = 0.05, rank: int = 4, **config: Any
) -> torch.nn.Module:
    """``model_dir``'s model wrapped by peft (rank ``rank``, alpha ``2 * rank``, no dropout, ``targets``), every
    ``lora_A`` / ``lora_B`` drawn from ``N(0, scale^2)`` with ``seed``; in eval mode. ``config``: more
    ``LoraConfig`` keywords. Needs the ``peft`` extra."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    cfg = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=targets, **config)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(model_dir), cfg)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)
    return model.eval()
