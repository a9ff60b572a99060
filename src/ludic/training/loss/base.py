"""The Loss seam and the one shared, memory-lean computation of the policy's token log-probs.

Every loss here is a mean over the batch's sequences of a per-sequence loss, so a trainer that scales
each micro-batch by ``mb_size / macro_size`` gets gradients independent of the split.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch
from torch import Tensor

from ludic.training.shapes import Float, Int, Shaped, shape_checked


class Stats(dict[str, Tensor]):
    """A loss's statistics: 0-dim detached tensors by name, each a mean over the micro-batch.

    ``token_means`` names the entries that are means over its action tokens (``kl_ref``, ``clip_frac``,
    ``logp_mean``, ...); the others are means over its sequences (``loss``, ``ratio_mean`` of a
    sequence ratio). The Trainer averages each entry over micro-batches weighted by its own count
    (action tokens or items), so neither kind depends on how a batch was split.
    """

    def __init__(self, values: Mapping[str, Tensor] | None = None, *, token_means: Iterable[str] = ()) -> None:
        super().__init__(values or {})
        self.token_means: set[str] = set(token_means)

    def add(self, *, per_token: bool = False, **values: Tensor) -> Stats:
        """Set ``values``; ``per_token=True`` marks them as means over action tokens."""
        self.update(values)
        if per_token:
            self.token_means.update(values)
        return self


def token_mean_keys(stats: Mapping[str, Tensor]) -> set[str]:
    """The keys of ``stats`` that are means over action tokens (none for a plain dict)."""
    return set(getattr(stats, "token_means", ())) & set(stats)


Batch = Mapping[str, Tensor]
"""A collated micro-batch: ``input_ids``, ``action_mask``, ``weight``, ... by name."""

LOGP_CHUNK_ELEMENTS = 1 << 22
"""Logit elements per chunk (16 MiB in float32): bounds the transient memory whatever B, T, V are."""


@runtime_checkable
class Loss(Protocol):
    """The one entry point of every loss: ``compute(logits [B, T, V], batch) -> (scalar loss, stats)``.

    The loss is a mean over the batch's sequences; ``stats`` are 0-dim detached tensors (a ``Stats``
    marks which are means over action tokens; a plain dict is read as means over sequences). A loss
    that reads the logits only through the policy's token log-probs subclasses ``TokenLogpLoss``,
    and the forward may then hand it those log-probs directly (``compute_from_logps``).
    """

    def compute(self, logits: Tensor, batch: Mapping[str, Tensor]) -> tuple[Tensor, Mapping[str, Tensor]]: ...


class _ShiftedTokenLogps(torch.autograd.Function):
    """``out[:, t] = logits[:, t-1, ids[t]] - logsumexp(logits[:, t-1])``; ``out[:, 0] = 0``.

    Computed in chunks over the sequence and upcast to float32 one chunk at a time. Unlike
    ``log_softmax(logits).gather(...)``, nothing of size [B, T, V] is saved for backward (only the
    [B, T] logsumexp); the backward writes ``grad = g * (onehot - softmax)`` chunk by chunk into the
    single [B, T, V] gradient it must return anyway.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, input_ids: Tensor, chunk: int) -> Tensor:  # type: ignore[override]
        B, T, _ = logits.shape
        acc = torch.promote_types(logits.dtype, torch.float32)  # bf16 logits are upcast per chunk
        targets = input_ids[:, 1:].unsqueeze(-1)  # [B, T-1, 1]: token t is scored by position t-1
        lse = torch.zeros(B, max(T - 1, 0), dtype=acc, device=logits.device)
        out = torch.zeros(B, T, dtype=acc, device=logits.device)
        for s in range(0, T - 1, chunk):
            e = min(s + chunk, T - 1)
            mb_logits = logits[:, s:e].to(acc)  # [B, c, V]
            lse[:, s:e] = torch.logsumexp(mb_logits, dim=-1)
            out[:, s + 1 : e + 1] = mb_logits.gather(-1, targets[:, s:e]).squeeze(-1) - lse[:, s:e]
        ctx.save_for_backward(logits, targets, lse)
        ctx.chunk = chunk
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None]:  # type: ignore[override]
        logits, targets, lse = ctx.saved_tensors
        T = logits.shape[1]
        grad = torch.empty_like(logits)
        grad[:, T - 1 :] = 0  # the last position scores no token
        for s in range(0, T - 1, ctx.chunk):
            e = min(s + ctx.chunk, T - 1)
            g = grad_out[:, s + 1 : e + 1].unsqueeze(-1).to(lse.dtype)  # [B, c, 1]
            # in place, in the gradient itself when dtypes agree: no [B, c, V] temporaries at all
            same = grad.dtype == lse.dtype
            mb_grad = (
                grad[:, s:e] if same else torch.empty(grad[:, s:e].shape, dtype=lse.dtype, device=grad.device)
            )
            torch.sub(logits[:, s:e], lse[:, s:e].unsqueeze(-1), out=mb_grad)
            mb_grad.exp_().mul_(-g)  # -softmax * g
            mb_grad.scatter_add_(-1, targets[:, s:e], g)  # + onehot * g
            if not same:
                grad[:, s:e] = mb_grad
        return grad, None, None


@shape_checked
def compute_token_logps(
    logits: Float[Tensor, "B T V"], input_ids: Int[Tensor, "B T"], *, chunk: int | None = None
) -> Float[Tensor, "B T"]:
    """Policy log-prob of each input token, ``[B, T]`` aligned with input positions (position 0 is 0).

    ``chunk`` is the number of sequence positions per chunk (default: ``LOGP_CHUNK_ELEMENTS // (B * V)``).
    """
    if logits.dim() != 3 or input_ids.dim() != 2 or logits.shape[:2] != input_ids.shape:
        raise ValueError(
            f"logits must be [B, T, V] and input_ids [B, T] with the same B, T; "
            f"got logits {tuple(logits.shape)}, input_ids {tuple(input_ids.shape)}"
        )
    B, _, V = logits.shape
    if chunk is None:
        chunk = max(1, LOGP_CHUNK_ELEMENTS // max(B * V, 1))
    return _ShiftedTokenLogps.apply(logits, input_ids.long(), int(chunk))


@shape_checked
def compute_logp_action(
    logits: Float[Tensor, "B T V"],
    input_ids: Int[Tensor, "B T"],
    action_mask: Shaped[Tensor, "B T"],
    *,
    length_normalize: bool = False,
) -> Float[Tensor, " B"]:
    """Sum (or, with ``length_normalize``, mean) of the policy's log-probs over action tokens: [B]."""
    token_logps = compute_token_logps(logits, input_ids)
    return seq_reduce(token_logps, action_mask, length_normalize=length_normalize)


def require(batch: Mapping[str, Tensor], key: str, owner: str) -> Tensor:
    """``batch[key]``, or a KeyError that names the key, the loss and what the batch has."""
    if key not in batch:
        raise KeyError(
            f"{owner} needs batch[{key!r}], but the batch has only {sorted(batch)}; "
            "ratio-based losses need actor logprobs from the inference engine (validate_actor_logps)"
        )
    return batch[key]


def action_mask_f(batch: Mapping[str, Tensor], owner: str) -> Tensor:
    return require(batch, "action_mask", owner).to(torch.float32)


def token_advantages(batch: Mapping[str, Tensor], owner: str, dtype: torch.dtype) -> Tensor:
    """``A_{i,t}`` broadcastable to [B, T]: ``batch["token_weight"]`` [B, T] when collation made one
    (items with per-token weights, e.g. one sequence per episode with per-turn credit), else
    ``batch["weight"][:, None]`` [B, 1] (one weight per sequence: ``A_{i,t} = A_i``)."""
    if "token_weight" in batch:
        return batch["token_weight"].to(dtype)
    return require(batch, "weight", owner).to(dtype)[:, None]


@shape_checked
def seq_reduce(x: Float[Tensor, "B T"], mask: Shaped[Tensor, "B T"], *, length_normalize: bool) -> Float[Tensor, " B"]:
    """Per-sequence ``sum_t mask * x`` [B], divided by the action-token count when ``length_normalize``."""
    mask = mask.to(x.dtype)
    total = (x * mask).sum(dim=-1)
    if length_normalize:
        total = total / mask.sum(dim=-1).clamp(min=1.0)
    return total


@shape_checked
def token_mean(x: Float[Tensor, "*shape"], mask: Shaped[Tensor, "*shape"]) -> Float[Tensor, ""]:
    """Mean of ``x`` over every action token of the batch (a statistic, 0 when there are none)."""
    mask = mask.to(x.dtype)
    return (x * mask).sum() / mask.sum().clamp(min=1.0)


@torch.no_grad()
def add_policy_stats(
    stats: Stats, batch: Batch, mask: Tensor, *, loss: Tensor, policy_logps: Tensor, adv: Tensor
) -> Stats:
    """The stats every weighted policy loss reports: ``loss``; ``adv_mean`` of ``adv``, over action
    tokens when the batch has per-token weights (``token_weight``: ``A_{i,t}``), else over sequences
    (``A_i``, [B] or [B, 1]); ``logp_mean`` over action tokens."""
    per_token_adv = "token_weight" in batch
    stats.add(loss=loss.detach())
    stats.add(per_token=per_token_adv, adv_mean=token_mean(adv, mask) if per_token_adv else adv.mean())
    return stats.add(per_token=True, logp_mean=token_mean(policy_logps.detach(), mask))


class TokenLogpLoss(ABC):
    """A loss that sees the logits only through the policy's token log-probs.

    ``compute`` derives them once; ``CompositeLoss`` derives them once for all of its terms and
    calls ``compute_from_logps`` on each. A subclass writes only its formula, in ``token_loss``.
    """

    @property
    def owner(self) -> str:
        """The loss's class name, for error messages."""
        return type(self).__name__

    def _require(self, batch: Batch, key: str) -> Tensor:
        """``batch[key]``, or a KeyError that names this loss (``require``)."""
        return require(batch, key, self.owner)

    def _token_advantages(self, batch: Batch, dtype: torch.dtype) -> Tensor:
        """``A_{i,t}`` [B, T], or ``A_i`` [B, 1] without per-token weights (``token_advantages``)."""
        return token_advantages(batch, self.owner, dtype)

    def compute(self, logits: Tensor, batch: Batch) -> tuple[Tensor, Stats]:
        policy_logps = compute_token_logps(logits, self._require(batch, "input_ids"))
        return self.compute_from_logps(policy_logps, batch)

    @shape_checked
    def compute_from_logps(
        self, policy_logps: Float[Tensor, "B T"], batch: Batch
    ) -> tuple[Float[Tensor, ""], Stats]:
        """``policy_logps`` is [B, T], aligned with ``batch["input_ids"]``."""
        return self.token_loss(policy_logps, action_mask_f(batch, self.owner), batch)

    @abstractmethod
    def token_loss(self, policy_logps: Tensor, mask: Tensor, batch: Batch) -> tuple[Tensor, Stats]:
        """The scalar loss and its stats from ``policy_logps`` [B, T] and the float action ``mask`` [B, T]."""
