"""``[lora]`` in a run config: the policy wrapped in peft LoRA adapters, and an embedded engine sharing its base.

The trainer trains only the adapters (peft freezes the base; ``Trainer`` optimises the trainable parameters)
and publishes them as ``[lora].publish`` says. With ``publish = "adapter"`` and the embedded engine, the
engine serves a plain model whose parameters are the trainer's frozen base tensors (no second copy of the
weights in the process); it serves each published adapter beside them (``serving = "unmerged"``) or folds it
into copies of the adapted layers (``"fold"``). The base is never written by either side: a full weight update
reaching such an engine first gives it weights of its own (``ludic.cli.shared_base_engine``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from ludic.config import RunConfig
from ludic.config.schema import LoraSection

PEFT_MISSING = "[lora] needs peft: pip install 'ludic[peft]'"


def peft_config(section: LoraSection) -> Any:
    """The ``peft.LoraConfig`` of ``section``."""
    from peft import LoraConfig

    return LoraConfig(
        r=section.rank,
        lora_alpha=section.lora_alpha,
        lora_dropout=section.dropout,
        target_modules=section.targets if isinstance(section.targets, str) else list(section.targets),
        use_rslora=section.rslora,
        bias="none",
    )


def wrap_policy(model: Any, section: LoraSection, base_path: str) -> Any:
    """``model`` with trainable adapters on ``section.targets``; every base weight frozen. ``base_path`` is
    recorded in the adapter's config (absolute when it is a local folder) so ``ludic export`` finds the base."""
    from peft import get_peft_model

    policy = get_peft_model(model, peft_config(section))
    local = Path(base_path)
    policy.peft_config["default"].base_model_name_or_path = (
        str(local.resolve()) if local.exists() else base_path
    )
    return policy


def publish_mode(cfg: RunConfig) -> str:
    """What the run's publisher sends from the policy: ``[lora].publish``, else merged (a full model)."""
    return "merged" if cfg.lora is None else cfg.lora.publish


def shares_base(cfg: RunConfig) -> bool:
    """Whether the embedded engine serves the trainer's frozen base tensors themselves: only when every
    publish is an adapter (a merged publish rewrites the engine's weights)."""
    return cfg.lora is not None and cfg.lora.publish == "adapter" and cfg.inference.backend == "embedded"


def base_view(policy: Any) -> Any:
    """A plain transformers model (no LoRA layers) whose parameters share storage with ``policy``'s frozen base.

    A deep copy of the base in which every parameter is a new ``Parameter`` over the same tensor (so the
    engine may rebind its own ``.data`` without touching the trainer's), and each LoRA layer is replaced by
    its base layer. Buffers (rotary tables) are copied: they are small.
    """
    from torch import nn

    base = policy.get_base_model()
    memo = {id(p): nn.Parameter(p.detach(), requires_grad=False) for p in base.parameters()}
    view = copy.deepcopy(base, memo)
    for name, module in list(view.named_modules()):
        if hasattr(module, "base_layer") and hasattr(module, "lora_A"):
            parent, _, child = name.rpartition(".")
            setattr(view.get_submodule(parent) if parent else view, child, module.get_base_layer())
    view.__dict__.pop("peft_config", None)  # peft's mark on the base: the view is a plain model
    return view.eval()


def make_shared_engine(cfg: RunConfig, policy: Any, **kwargs: Any) -> Any:
    """The embedded engine serving ``policy``'s base (shared, see :func:`base_view`) with ``[lora].serving``."""
    from ludic.cli.runtime import load_tokenizer
    from ludic.cli.shared_base_engine import SharedBaseEngine

    assert cfg.lora is not None
    return SharedBaseEngine(
        base_view(policy), load_tokenizer(cfg), adapter_serving=cfg.lora.serving, **kwargs
    )


def lora_errors(cfg: RunConfig) -> list[str]:
    """What ``--dry-run`` can say about ``[lora]`` without loading weights: peft installed, and every target
    naming a module of ``[model]`` (built on the meta device from its config); empty when fine."""
    if cfg.lora is None:
        return []
    try:
        import peft  # noqa: F401
    except ImportError:
        return [PEFT_MISSING]
    if isinstance(cfg.lora.targets, str):
        return []
    modules = _module_types(cfg.model.path)
    if modules is None:
        return []  # not a config transformers reads here: the load reports it
    linear_leaves = sorted({n.rpartition(".")[2] for n, kind in modules.items() if kind == "Linear"})
    errors = []
    for target in cfg.lora.targets:
        hits = {n: kind for n, kind in modules.items() if n == target or n.endswith("." + target)}
        if not hits:
            errors.append(f"[lora].targets: {target!r} names no module of {cfg.model.path!r} (its linear layers: "
                          f"{', '.join(linear_leaves)}; or targets = \"all-linear\")")  # fmt: skip
        elif cfg.lora.publish == "adapter" and any(kind != "Linear" for kind in hits.values()):
            other = next(f"{n} ({kind})" for n, kind in hits.items() if kind != "Linear")
            errors.append(f"[lora].targets: {target!r} matches {other}, not a linear layer: an adapter publish "
                          "serves linear layers only; set [lora].publish = \"merged\" or leave it out")  # fmt: skip
    return errors


def _module_types(path: str) -> dict[str, str] | None:
    """``module name -> class name`` of the model at ``path``, built on the meta device (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:
        return None
    return {name: type(module).__name__ for name, module in model.named_modules() if name}
