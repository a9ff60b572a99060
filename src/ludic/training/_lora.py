"""Export a peft LoRA model for publishing: merged weights under the base names, or the adapter alone.

``publish="merged"`` (the default): ``W + delta`` for every LoRA layer, computed out of place (the
adapter being trained is never merged into the model), under the base model's parameter names: any
server takes it. ``publish="adapter"``: only the lora_A/lora_B tensors and their config
(``ludic.distributed.lora_payload``), which Ludic's server (and vLLM with ``--enable-lora``) serves
on top of the base it holds; ~1% of the bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ludic.distributed.lora_payload import adapter_payload, check_lora_mode
from ludic.training.checkpoint._model_io import is_peft_model

ParamFilter = Callable[[str, torch.Tensor], bool]
_ADAPTER_MARKERS = (
    ".lora_A.", ".lora_B.", ".lora_embedding_A.", ".lora_embedding_B.", ".lora_magnitude_vector.", ".original_module.",
)


def _lora_deltas(base: nn.Module) -> dict[str, tuple[torch.Tensor, torch.Tensor | None]]:
    """``module name -> (summed delta weight, summed delta bias or None)`` of the active adapters of each
    LoRA layer; the bias delta is ``lora_B.bias * scaling`` of adapters trained with ``lora_bias=True``
    (peft's ``merge`` adds the same)."""
    deltas: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    for name, module in base.named_modules():
        if not (hasattr(module, "get_delta_weight") and hasattr(module, "base_layer")):
            continue
        active = getattr(module, "active_adapters", [])
        known = getattr(module, "lora_A", {}) or getattr(module, "lora_embedding_A", {})
        names = [a for a in active if a in known]
        if getattr(module, "merged", False) or not names:
            continue  # already merged into base_layer, or no active adapter here
        weight = _weight_delta(name, module, names)
        biased = [a for a in names if getattr(module, "lora_bias", {}).get(a, False)]
        if biased and getattr(module.get_base_layer(), "bias", None) is None:
            raise ValueError(
                f"{name}: lora_bias=True on a layer without a bias cannot be merged (as peft's merge)"
            )
        bias = sum(module.lora_B[a].bias * module.scaling[a] for a in biased) if biased else None
        deltas[name] = (weight, bias)
    return deltas


def _weight_delta(name: str, module: nn.Module, adapters: list[str]) -> torch.Tensor:
    """The change merging ``adapters`` makes to the layer's weight. A plain LoRA adds ``get_delta_weight``;
    a variant (DoRA: the magnitude times the column-normalised ``W + delta``) is merged by peft's own
    ``merge_safe``, out of place, so the merged weight is peft's."""
    variants = getattr(module, "lora_variant", {})
    if not any(a in variants for a in adapters):
        return sum(module.get_delta_weight(a) for a in adapters)
    if len(adapters) > 1:
        raise NotImplementedError(f"merged export of several active adapters with a LoRA variant (DoRA) on {name}")
    weight = module.get_base_layer().weight.detach()
    return variants[adapters[0]].merge_safe(module, adapters[0], weight.clone()) - weight


def _refuse_tied(base: nn.Module, deltas: dict) -> None:
    """A LoRA layer whose base weight is shared with another module (``lm_head`` tied to the embedding):
    merging into it would change the other module too, so the served model would not be the trained one."""
    owners = {id(p): n for n, p in base.named_parameters(remove_duplicate=False) if ".base_layer." not in n}
    for name in deltas:
        weight = base.get_submodule(name).get_base_layer().weight
        if id(weight) in owners:
            raise ValueError(
                f"LoRA on {name}, whose weight is tied to {owners[id(weight)]}: a merged publish would change "
                "that module too. Untie them (tie_word_embeddings=False), leave this layer out of "
                "target_modules, or publish the adapter (lora='adapter') to a server serving it unmerged"
            )


def _base_name(key: str, adapter_names: list[str]) -> str:
    key = key.replace(".base_layer.", ".")
    for a in adapter_names:
        key = key.replace(f".modules_to_save.{a}.", ".")
    return key


def merged_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Detached weights to publish: merged LoRA weights under base names, or the plain state dict."""
    with torch.no_grad():
        if not is_peft_model(model):
            return {k: v.detach() for k, v in model.state_dict().items()}
        base = model.get_base_model()
        deltas = _lora_deltas(base)
        _refuse_tied(base, deltas)
        adapters = list(getattr(model, "peft_config", {}))
        out: dict[str, torch.Tensor] = {}
        for key, tensor in base.state_dict().items():
            if any(m in key for m in _ADAPTER_MARKERS):
                continue
            module_name, _, leaf = key.rpartition(".")
            owner = module_name.removesuffix(".base_layer")
            if module_name.endswith(".base_layer") and owner in deltas:
                delta = dict(zip(("weight", "bias"), deltas[owner], strict=True)).get(leaf)
                tensor = tensor if delta is None else tensor + delta.to(tensor.dtype)
            out[_base_name(key, adapters)] = tensor.detach()
        return out


def publishable_state_dict(
    model: nn.Module, param_filter: ParamFilter | None = None, *, publish: str = "merged"
) -> dict[str, torch.Tensor]:
    """``merged_state_dict`` restricted to the names ``param_filter(name, tensor)`` accepts; with
    ``publish="adapter"`` and a peft model, the ``AdapterPayload`` instead (no filter applies to it)."""
    if check_lora_mode(publish) == "adapter" and is_peft_model(model):
        if param_filter is not None:
            raise ValueError(
                "param_filter selects merged weights; an adapter publish sends the whole adapter"
            )
        return adapter_payload(model)
    state = merged_state_dict(model)
    if param_filter is None:
        return state
    return {k: v for k, v in state.items() if param_filter(k, v)}
