"""Serving a LoRA adapter on the embedded engine: the pristine base kept, ``W = W_base + scaling * B @ A`` applied.

The simplest exact way to serve one adapter is to fold it into the weights the forward already reads:
the engine keeps a copy of each adapted layer's base weight and, under its weights lock (the same lock
and versioning as a full update), sets ``W = W_base + scaling * B @ A`` on the targeted layers and puts
the base back on layers the previous adapter targeted and this one does not. Everything is computed
before anything is written, so an adapter applies whole or not at all; one that fails its checks
(names, shapes, finite values once cast, the same base) is refused and the old weights keep serving.

One adapter at a time (the policy being trained): it applies to every request. A full update replaces
the base: the adapted layers are first put back to their base, then the update is loaded, and the
adapter is dropped (the next adapter publish applies on the new base).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import torch
from torch import nn

from ludic.inference.weight_sync.adapter_config import AdapterConfig, base_fingerprint, lora_names
from ludic.inference.weight_sync.packing import TensorMeta, dtype_name
from ludic.inference.weight_sync.weights import first_non_finite, non_finite_message


@contextmanager
def one_thread() -> Iterator[None]:
    """Many small products and copies: on a busy CPU, waking every OpenMP thread for each one cost 10-20x the
    work itself (measured: 56 adds of 2.3 MB, 1.7 s on 2 threads vs 0.07 s on 1). Per thread; restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class AdapterRefused(ValueError):
    """An adapter that does not fit the served model (HTTP 400); nothing changed."""


class AdapterState:
    """The adapter folded into ``model``'s weights (if any) and the base weights under it."""

    def __init__(self) -> None:
        self.config: AdapterConfig | None = None
        self.pristine: dict[str, torch.Tensor] = {}  # weight name -> base weight, for the adapted layers
        self._fingerprint: str | None = None  # of the base, cached until a full update changes it

    # ---- checks (no change) ---------------------------------------------------------------------
    def fingerprint(self, model: nn.Module) -> str:
        if self._fingerprint is None:
            state = model.state_dict()
            self._fingerprint = base_fingerprint((k, self.pristine.get(k, v)) for k, v in state.items())
        return self._fingerprint

    def expected_metas(self, model: nn.Module, config: AdapterConfig) -> list[TensorMeta]:
        """Names/dtypes/shapes ``config``'s tensors must have on this model (A ``[r, in]``, B ``[out, r]``)."""
        state = model.state_dict()
        metas = []
        for module in config.target_modules:
            weight = state.get(f"{module}.weight")
            if weight is None or weight.dim() != 2:
                raise AdapterRefused(f"adapter targets {module!r}, which is not a linear layer of the served model")
            out_features, in_features = weight.shape
            a_name, b_name = lora_names(module)
            metas.append(TensorMeta(a_name, dtype_name(weight.dtype), (config.rank, in_features)))
            metas.append(TensorMeta(b_name, dtype_name(weight.dtype), (out_features, config.rank)))
        return metas

    def check_base(self, model: nn.Module, config: AdapterConfig) -> None:
        served = self.fingerprint(model)
        if config.base_fingerprint != served:
            raise AdapterRefused(f"adapter {config.name!r} was trained on base {config.base_fingerprint}, the served "
                                 f"base is {served}: publish merged weights or serve the adapter's base model")  # fmt: skip

    def validate(self, model: nn.Module, tensors: Mapping[str, torch.Tensor], config: AdapterConfig) -> None:
        """Names exactly the config's, shapes the model's, float, finite once cast, the same base."""
        metas = {m.name: m for m in self.expected_metas(model, config)}
        if set(tensors) != set(metas):
            extra, lacking = sorted(set(tensors) - set(metas)), sorted(set(metas) - set(tensors))
            raise AdapterRefused(f"adapter tensors do not match its config: unexpected {extra[:3]}, missing {lacking[:3]}")
        for name, tensor in tensors.items():
            if tuple(tensor.shape) != metas[name].shape:
                raise AdapterRefused(f"adapter {name!r} has shape {list(tensor.shape)}, expected {list(metas[name].shape)}")
            if not tensor.is_floating_point():
                raise AdapterRefused(f"adapter {name!r} has dtype {tensor.dtype}, expected a floating-point tensor")
        bad = first_non_finite(tensors, {n: m.dtype for n, m in metas.items()})
        if bad is not None:
            raise AdapterRefused(non_finite_message(bad, tensors[bad].dtype, metas[bad].dtype).replace("sync_weights", "adapter"))
        self.check_base(model, config)

    # ---- changes (the caller holds the engine's weights lock) -----------------------------------
    def apply(self, model: nn.Module, tensors: Mapping[str, torch.Tensor], config: AdapterConfig) -> None:
        """Fold the (validated) adapter into ``model``: every new weight computed first, then written."""
        with one_thread():
            self._apply(model, tensors, config)

    def _apply(self, model: nn.Module, tensors: Mapping[str, torch.Tensor], config: AdapterConfig) -> None:
        params = dict(model.named_parameters(remove_duplicate=False))
        new: dict[str, torch.Tensor] = {}
        for module, scaling in zip(config.target_modules, config.scalings, strict=True):
            name = f"{module}.weight"
            base = self.pristine.get(name, params[name].detach())
            a, b = (tensors[n].to(base.device, torch.float32) for n in lora_names(module))
            new[name] = torch.addmm(base.float(), b, a, alpha=scaling).to(base.dtype)  # W + scaling * (B @ A)
        for name in set(self.pristine) - set(new):  # adapted before, not now: back to the base
            new[name] = self.pristine[name]
        with torch.no_grad():
            for name in new:
                if name not in self.pristine:
                    self.pristine[name] = params[name].detach().clone()
            for name, weight in new.items():
                params[name].copy_(weight)
        self.pristine = {n: w for n, w in self.pristine.items() if n in {f"{m}.weight" for m in config.target_modules}}
        self.config = config

    def restore_base(self, model: nn.Module) -> None:
        """Put the base back under every adapted layer and forget the adapter (before a full update)."""
        if self.pristine:
            params = dict(model.named_parameters(remove_duplicate=False))
            with torch.no_grad(), one_thread():
                for name, weight in self.pristine.items():
                    params[name].copy_(weight)
        self.pristine, self.config, self._fingerprint = {}, None, None
