"""The private PyTorch ops the CPU kernels call, each probed once per process with a tiny call.

``torch.ops.mkldnn._linear_pointwise``, ``_reorder_linear_weight``,
``aten.mkldnn_linear_backward_weights`` and ``aten._scaled_dot_product_flash_attention_for_cpu`` are
what inductor's CPU backend calls; they carry no stability promise, so a torch upgrade may rename,
remove or change them. ``works(name)`` looks the op up and runs it once on a few numbers against the
plain computation (``F.linear``, ``dy^T x``, SDPA); an op that is missing, raises or disagrees is
reported in one log line and the kernels that need it take the plain path (``ludic.kernels.select``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

logger = logging.getLogger(__name__)

LINEAR_POINTWISE = "mkldnn._linear_pointwise"
REORDER_LINEAR_WEIGHT = "mkldnn._reorder_linear_weight"
LINEAR_BACKWARD_WEIGHTS = "aten.mkldnn_linear_backward_weights"
FLASH_ATTENTION_CPU = "aten._scaled_dot_product_flash_attention_for_cpu"


def lookup(name: str) -> Callable[..., Any] | None:
    """The op ``name`` (``"namespace.op"``) of the running torch, or None when it has none."""
    namespace, op = name.split(".")
    try:
        return getattr(getattr(torch.ops, namespace), op)
    except (AttributeError, RuntimeError):
        return None


def _trial_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.linspace(-1.0, 1.0, 6).view(2, 3)  # [rows, in]
    weight = torch.linspace(-0.5, 0.7, 12).view(4, 3)  # [out, in]
    return x, weight, torch.linspace(0.1, 0.4, 4)


def _linear_pointwise(op: Callable[..., Any]) -> bool:
    x, weight, bias = _trial_inputs()
    return torch.allclose(op(x, weight, bias, "none", [], ""), F.linear(x, weight, bias), atol=1e-6)


def _reorder_linear_weight(op: Callable[..., Any]) -> bool:
    x, weight, bias = _trial_inputs()
    linear = lookup(LINEAR_POINTWISE)  # a reordered weight is only read by the pointwise linear
    if linear is None:
        raise RuntimeError(f"it is read by torch.ops.{LINEAR_POINTWISE}, which is missing")
    return torch.allclose(linear(x, op(weight, 2), bias, "none", [], ""), F.linear(x, weight, bias), atol=1e-6)


def _linear_backward_weights(op: Callable[..., Any]) -> bool:
    x, weight, _ = _trial_inputs()
    dy = torch.linspace(-0.3, 0.9, 8).view(2, 4)  # [rows, out]
    grad_w, grad_b = op(dy.to_mkldnn(), x.to_mkldnn(), weight.to_mkldnn(), True)
    return torch.allclose(grad_w.to_dense(), dy.t() @ x, atol=1e-6) and torch.allclose(
        grad_b.to_dense(), dy.sum(0), atol=1e-6
    )


def _flash_attention_cpu(op: Callable[..., Any]) -> bool:
    q, k, v = (torch.linspace(-1.0, 1.0, 12).view(1, 1, 3, 4) * s for s in (1.0, 0.5, 2.0))
    out, lse = op(q, k, v, 0.0, False, attn_mask=None, scale=0.5)
    scores = (q @ k.transpose(-1, -2)) * 0.5
    plain = F.scaled_dot_product_attention(q, k, v, scale=0.5)
    return torch.allclose(out, plain, atol=1e-6) and torch.allclose(
        lse.view(-1), torch.logsumexp(scores, -1).view(-1), atol=1e-5
    )


TRIALS: dict[str, Callable[[Callable[..., Any]], bool]] = {
    LINEAR_POINTWISE: _linear_pointwise,
    REORDER_LINEAR_WEIGHT: _reorder_linear_weight,
    LINEAR_BACKWARD_WEIGHTS: _linear_backward_weights,
    FLASH_ATTENTION_CPU: _flash_attention_cpu,
}


@functools.cache
def works(name: str) -> bool:
    """True when the running torch has the op ``name`` and a tiny call of it gives the plain values.

    Probed once per process (cached); a False is logged once, naming the op and the torch version."""
    op = lookup(name)
    if op is None:
        return _unusable(name, "has no such op")
    try:
        if TRIALS[name](op):
            return True
        return _unusable(name, "gives other values than the plain path on a probe")
    except Exception as error:
        return _unusable(name, f"fails on a probe ({type(error).__name__}: {error})")


def _unusable(name: str, why: str) -> bool:
    logger.warning(
        "ludic.kernels: torch %s: %s %s; the CPU kernels that need it take the plain PyTorch path",
        torch.__version__, f"torch.ops.{name}", why,
    )  # fmt: skip
    return False
