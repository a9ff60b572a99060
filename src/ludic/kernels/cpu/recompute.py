"""Training layers that keep less for their backward: the elementwise parts are recomputed there.

A decoder layer's backward reads what its forward kept. Plain autograd keeps, per token, the gated
MLP's gate and up projections, SiLU's output and their product (4 x intermediate size), and each
RMSNorm's input and normalized input (2 x hidden size). The elementwise ops that produce the SiLU
output, the product and the normalized input are cheap to run again, so these layers keep only
what cannot be recomputed for free:

    gated MLP     y = (silu(g) * u) W^T + b,   g = gate(x), u = up(x)
                  keeps g, u (2 x intermediate);  in the backward, with s = sigmoid(g), a = g * s,
                  p = a * u:   dW = dy^T p,  db = sum_rows dy,  dp = dy W,
                               du = dp * a,  dg = dp * u * s * (1 + g * (1 - s))  (aten's silu_backward)
    RMSNorm       y = w * x * r,   r = 1 / sqrt(mean(x^2) + eps)
                  keeps x and r (one per row);  with n = x * r:
                               dw = sum_rows dy * n,  dn = dy * w,  dx = r * (dn - n * mean(dn * n))

At SmolLM2-135M (30 layers, hidden 576, intermediate 1,536) that is 3,072 + 1,152 fewer floats per token
per layer: 0.51 MB less per token of a micro-batch, about a third of what its backward keeps. Results
equal autograd's through the original layers to float rounding (tests); the products that are
recomputed cost a few elementwise passes, no matmul.

``recomputing_layers(model)`` switches the model's gated MLPs and RMSNorms (of the architectures in
``GATED_MLPS`` / ``RMS_NORMS`` whose forward is exactly the formula above) for a block of code, forward
and backward, as ``onednn_linear.onednn_linears`` does; fp32 tensors only, others take the layer's own
forward. The MLP's down projection runs on oneDNN when ``onednn`` is set (as it would inside
``onednn_linears``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ludic.kernels.cpu import rms_norm, swiglu
from ludic.kernels.cpu.onednn_linear import (
    as_rows,
    forward_pays,
    inner_product,
    linear_grads,
    onednn_available,
)

GATED_MLPS = frozenset({"LlamaMLP", "MistralMLP", "Qwen2MLP", "Qwen3MLP"})
"""MLP classes whose forward is ``down_proj(silu(gate_proj(x)) * up_proj(x))``."""
RMS_NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"})
"""RMSNorm classes whose forward is ``weight * x * rsqrt(mean(x^2) + variance_epsilon)`` (not Gemma's 1 + w)."""
SILU = frozenset({"SiLU", "SiLUActivation"})


class GatedMLPDown(torch.autograd.Function):
    """``F.linear(silu(gate) * up, weight, bias)`` keeping ``gate`` and ``up`` only (formulas above).
    ``native``: the elementwise part in one pass of ``swiglu``'s kernel each way, where it takes the tensors."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, gate: Tensor, up: Tensor, weight: Tensor, bias: Tensor | None, onednn: bool, native: bool
    ) -> Tensor:
        g2, u2 = as_rows(gate), as_rows(up)
        native = native and swiglu.takes(g2, u2)
        product = swiglu.forward(g2, u2) if native else F.silu(g2) * u2  # [rows, intermediate]
        use_onednn = onednn and forward_pays(product.shape[0], weight.shape[1], weight.shape[0])
        out = inner_product(product, weight, bias) if use_onednn else F.linear(product, weight, bias)
        ctx.save_for_backward(g2, u2, weight)
        ctx.shape, ctx.has_bias, ctx.onednn, ctx.native = gate.shape, bias is not None, use_onednn, native
        return out.view(*gate.shape[:-1], weight.shape[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        g, u, weight = ctx.saved_tensors
        need_g, need_u, need_w, need_b, _, _ = ctx.needs_input_grad
        dy, need_b = as_rows(grad_out), need_b and ctx.has_bias
        if ctx.native:  # dp first, then p, du and dg in one pass, then the weight's gradients from p
            dp, _, _ = linear_grads(dy, None, weight, need_x=need_g or need_u, need_w=False, need_b=False, onednn=ctx.onednn)
            p = grad_g = grad_u = None
            if dp is not None:
                p, grad_u, grad_g = swiglu.backward(g, u, dp.contiguous(), want_p=need_w)
            elif need_w:
                p = swiglu.forward(g, u)
            _, grad_w, grad_b = linear_grads(dy, p, weight, need_x=False, need_w=need_w, need_b=need_b, onednn=ctx.onednn)
            grad_u = grad_u.view(ctx.shape) if need_u and grad_u is not None else None
            grad_g = grad_g.view(ctx.shape) if need_g and grad_g is not None else None
            return grad_g, grad_u, grad_w, grad_b, None, None
        a = F.silu(g)
        dp, grad_w, grad_b = linear_grads(
            dy, a * u if need_w else None, weight,
            need_x=need_g or need_u, need_w=need_w, need_b=need_b, onednn=ctx.onednn,
        )  # fmt: skip
        grad_g = grad_u = None
        if dp is not None:
            grad_u = (dp * a).view(ctx.shape) if need_u else None
            if need_g:  # (dp * u) * s * (1 + g * (1 - s)) in one pass: aten's own SiLU backward kernel
                grad_g = torch.ops.aten.silu_backward(dp.mul_(u), g).view(ctx.shape)
        return grad_g, grad_u, grad_w, grad_b, None, None


class RMSNormKeepInput(torch.autograd.Function):
    """``weight * x * rsqrt(mean(x^2) + eps)`` keeping ``x`` and the per-row ``rsqrt`` only. ``native``: forward
    and backward in one pass of ``rms_norm``'s kernel each, where it takes the tensors."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float, native: bool) -> Tensor:  # type: ignore[override]
        ctx.native = native and rms_norm.takes(x, weight)
        if ctx.native:
            y, r = rms_norm.forward(x, weight, eps)
            ctx.save_for_backward(x, weight, r)
            return y
        r = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, r)
        return weight * (x * r)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        x, weight, r = ctx.saved_tensors
        need_x, need_w, _, _ = ctx.needs_input_grad
        if ctx.native:
            grad_x, grad_w = rms_norm.backward(x, weight, r, grad_out, need_x=need_x, need_w=need_w)
            return grad_x, grad_w, None, None
        n = x * r
        grad_w = (grad_out * n).reshape(-1, n.shape[-1]).sum(0) if need_w else None
        grad_x = None
        if need_x:
            dn = grad_out * weight
            grad_x = dn.sub_(n.mul_((dn * n).mean(-1, keepdim=True))).mul_(r)
        return grad_x, grad_w, None, None


def _fp32_cpu(*tensors: Tensor | None) -> bool:
    return all(
        t is None or (type(t) in (Tensor, nn.Parameter) and t.dtype == torch.float32 and t.device.type == "cpu")
        for t in tensors
    )


def _mlp_forward(mlp: nn.Module, onednn: bool, native: bool) -> Callable[[Tensor], Tensor]:
    original = type(mlp).forward.__get__(mlp)
    down = mlp.down_proj

    def forward(x: Tensor) -> Tensor:
        if not _fp32_cpu(x, down.weight, down.bias):
            return original(x)
        gate, up = mlp.gate_proj(x), mlp.up_proj(x)
        if not _fp32_cpu(gate, up):
            return original(x)
        return GatedMLPDown.apply(gate, up, down.weight, down.bias, onednn, native)

    return forward


def _norm_forward(norm: nn.Module, native: bool) -> Callable[[Tensor], Tensor]:
    original = type(norm).forward.__get__(norm)

    def forward(x: Tensor) -> Tensor:
        if not _fp32_cpu(x, norm.weight):
            return original(x)
        return RMSNormKeepInput.apply(x, norm.weight, float(norm.variance_epsilon), native)

    return forward


def _is_gated_mlp(m: nn.Module) -> bool:
    return (
        type(m).__name__ in GATED_MLPS
        and type(getattr(m, "act_fn", None)).__name__ in SILU
        and type(getattr(m, "down_proj", None)) is nn.Linear  # LoRA- or quantisation-wrapped: the layer's own
        and all(isinstance(getattr(m, k, None), nn.Module) for k in ("gate_proj", "up_proj"))
    )


def _is_rms_norm(m: nn.Module) -> bool:
    weight = getattr(m, "weight", None)
    return type(m).__name__ in RMS_NORMS and isinstance(weight, Tensor) and weight.dim() == 1 and hasattr(m, "variance_epsilon")


def switchable_layers(model: nn.Module) -> list[nn.Module]:
    """The gated MLPs and RMSNorms of ``model`` that ``recomputing_layers`` switches."""
    return [m for m in model.modules() if "forward" not in m.__dict__ and (_is_gated_mlp(m) or _is_rms_norm(m))]


@contextlib.contextmanager
def recomputing_layers(
    model: nn.Module, enabled: bool = True, *, onednn: bool = False, native_swiglu: bool = False,
    native_rms_norm: bool = False,
) -> Iterator[None]:
    """Within the block, ``model``'s gated MLPs and RMSNorms keep only what their backward cannot
    recompute elementwise (module docstring); a no-op when ``enabled`` is False. ``onednn``: the MLP's
    down projection on oneDNN where ``forward_pays`` (and this torch runs it); ``native_swiglu``: its
    elementwise part through ``swiglu``'s kernel, ``native_rms_norm``: the norms through ``rms_norm``'s
    (each where it is available)."""
    if not enabled:
        yield
        return
    onednn = onednn and onednn_available()
    mlp_native, norm_native = native_swiglu and swiglu.available(), native_rms_norm and rms_norm.available()
    switched = switchable_layers(model)
    for m in switched:
        m.forward = _mlp_forward(m, onednn, mlp_native) if _is_gated_mlp(m) else _norm_forward(m, norm_native)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for m in switched:
            del m.forward
