"""Serving a LoRA adapter unmerged: the base weights untouched, ``base(x) + (x A^T) B^T * scaling`` per layer.

A publish then only checks A and B and keeps a copy of them (5 MB for a 100M model at rank 16 on q/k/v/o),
instead of folding ``W_base + scaling * B @ A`` into every adapted weight (``adapters.py``: ~1 GFLOP and two
passes over the weights). The price is paid at every forward: two thin products per adapted layer. Each
adapted ``nn.Linear`` carries its ``LoraTerm`` at ``LORA_ATTR``: the transformers forward adds it through a
forward hook (same op order as peft's ``lora.Linear.forward``: ``result + lora_B(lora_A(x)) * scaling``, so
the served log-probs match the trainer's peft model), and the lean decoder binds it beside the weights
(``ludic.kernels.cpu.lean_weights``). Layers without an adapter have no hook and no term: no extra work.

All or nothing: every term is built (copies of A and B in the served dtype) before any layer changes;
the swap then only sets attributes and hooks, which cannot fail.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.hooks import RemovableHandle

from ludic.inference.weight_sync.adapter_config import AdapterConfig, lora_names
from ludic.inference.weight_sync.weights import finite_as
from ludic.kernels.cpu.lean_weights import LORA_ATTR


@dataclass(frozen=True)
class LoraTerm:
    """One layer's adapter: ``a [r, in]``, ``b [out, r]`` (the served dtype and device), ``scaling``."""

    a: torch.Tensor
    b: torch.Tensor
    scaling: float


def _add_lora(module: nn.Module, args: tuple, output: torch.Tensor) -> torch.Tensor:
    """Forward hook: ``output + lora_B(lora_A(x)) * scaling`` (peft's ``lora.Linear.forward``)."""
    term: LoraTerm = getattr(module, LORA_ATTR)
    x = args[0].to(term.a.dtype)
    return output + F.linear(F.linear(x, term.a), term.b) * term.scaling


class UnmergedLayers:
    """The adapted layers' terms and hooks; ``stage`` builds a new set, ``swap`` serves it whole."""

    def __init__(self) -> None:
        self.hooks: dict[str, RemovableHandle] = {}  # module name -> its forward hook

    @staticmethod
    def stage(model: nn.Module, tensors: Mapping[str, torch.Tensor], config: AdapterConfig) -> dict[str, LoraTerm]:
        """Copies of the (validated) A and B of every target in the served dtype; the model is not touched."""
        modules = dict(model.named_modules())
        staged = {}
        for module, scaling in zip(config.target_modules, config.scalings, strict=True):
            weight = modules[module].weight
            a, b = (tensors[n].detach().to(weight.device, weight.dtype, copy=True).contiguous() for n in lora_names(module))
            staged[module] = LoraTerm(a, b, float(scaling))
        return staged

    def swap(self, model: nn.Module, staged: Mapping[str, LoraTerm]) -> None:
        """Serve ``staged`` (from ``stage``): hooks and terms set, layers adapted before and not now back to the base."""
        modules = dict(model.named_modules())
        for name in set(self.hooks) - set(staged):
            self._detach(modules[name], name)
        for name, term in staged.items():
            setattr(modules[name], LORA_ATTR, term)
            if name not in self.hooks:
                self.hooks[name] = modules[name].register_forward_hook(_add_lora)

    def clear(self, model: nn.Module) -> None:
        """Every layer back to its base (no hook, no term)."""
        modules = dict(model.named_modules())
        for name in list(self.hooks):
            self._detach(modules[name], name)

    def _detach(self, module: nn.Module, name: str) -> None:
        self.hooks.pop(name).remove()
        delattr(module, LORA_ATTR)


def overflows(term: LoraTerm) -> bool:
    """Whether ``scaling * B @ A`` has NaN or inf in the served dtype: finite A, B and scaling can still overflow
    (1e20 * 1e20), and the fold refuses that product, so serving it unmerged must too. A bound first
    (``|scaling| * r * max|A| * max|B|``, one pass over A and B); the product itself (float64, exact enough to
    tell) only when an adapter passes the bound."""
    dtype = term.a.dtype
    limit = torch.finfo(dtype).max
    a_max, b_max = (float(t.detach().abs().max()) if t.numel() else 0.0 for t in (term.a, term.b))
    if abs(term.scaling) * term.a.shape[0] * a_max * b_max <= limit:
        return False
    product = torch.mm(term.b.detach().double(), term.a.detach().double()) * term.scaling
    return not finite_as(product, dtype)


def unmerged_unsupported(model: nn.Module, module: str) -> str | None:
    """Why ``module`` cannot serve an unmerged adapter (None when it can): hooks add to ``nn.Linear`` outputs."""
    layer = dict(model.named_modules()).get(module)
    if not isinstance(layer, nn.Linear):
        return f"adapter targets {module!r}, which is not an nn.Linear: serve it with adapter_serving='fold'"
    return None
