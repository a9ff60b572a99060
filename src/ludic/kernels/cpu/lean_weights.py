"""The weights one lean decoding batch reads (``LeanDecoder.bind``), with any unmerged LoRA terms beside them.

A batch looks the model's weights up once: per layer the norms, q/k/v and gate/up (fused into one matmul
each on the CPU: the output columns side by side, each still the same dot product), o_proj and down,
then the final norm and the output layer. A linear layer serving an unmerged LoRA adapter carries its
``LoraTerm`` at ``LORA_ATTR`` (``ludic.inference.embedded.unmerged``); the batch then computes
``y = x W^T + (x A^T) (scaling B)^T`` for that matmul with ONE extra op: A's rows are appended to the
matmul's (copied, maybe packed) weight, so its output's last ``r`` columns are ``x A^T``, and one in-place
``addmm`` adds them times ``(scaling B)^T`` to the first ones (``LoraDelta.finish``). A matmul fusing several
layers gets one delta: their A's stacked and their scaled B's block-diagonal (the zero blocks add exact zeros).
At these sizes the op count matters more than the FLOPs (the products are ~2% of a step's; measured at
100M, 16 rows, one thread, interleaved: peft's four ops per matmul, ``y + ((x A^T) B^T) * scaling``, made a
step 6.2% slower, this layout 2.1-3.7%; docs/lora.md). Departure from peft's order:
scaling multiplies B before the product, so the logits match the peft model to fp32 rounding (test), as
the packed matmuls already do. With no adapter no delta exists and the step does no extra work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

LORA_ATTR = "ludic_lora"
"""The attribute of an ``nn.Linear`` holding its unmerged LoRA term (``a [r, in]``, ``b [out, r]``, ``scaling``)."""

Proj = tuple[torch.Tensor, torch.Tensor | None]  # (weight, bias) of one matmul, maybe packed


@dataclass(slots=True)
class LoraDelta:
    """One matmul's adapter: ``a [R, in]`` (appended to its weight at bind) and ``bt [R, out]`` (scaling * B,
    transposed; block-diagonal when the matmul fuses layers)."""

    out: int  # the matmul's own output columns, before the appended ``x A^T``
    a: torch.Tensor  # [R, in]
    bt: torch.Tensor  # [R, out]

    def extend(self, proj: Proj) -> Proj:
        """``proj``'s weight with A's rows appended (and zeros for them in its bias): a copy."""
        weight, bias = proj
        return torch.cat([weight, self.a]), None if bias is None else torch.cat([bias, bias.new_zeros(self.a.shape[0])])

    def finish(self, y: torch.Tensor) -> torch.Tensor:
        """``y [n, out + R]`` from the extended weight -> ``[n, out]``: ``x W^T + (x A^T) (scaling B)^T``, in place."""
        return y[:, : self.out].addmm_(y[:, self.out :], self.bt)


@dataclass(slots=True)
class LayerLora:
    """One layer's deltas, aligned with ``LayerWeights``' projections (None: that matmul has none)."""

    qkv: list[LoraDelta | None]
    o_proj: LoraDelta | None
    gate_up: list[LoraDelta | None]
    down: LoraDelta | None


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer's weights as the step uses them. ``qkv`` and ``gate_up`` hold one fused
    ``(weight, bias)`` projection whose output columns are the separate projections' side by side,
    or the projections apart (see ``LeanDecoder.bind``). ``lora``: None unless an adapter is served unmerged."""

    input_norm: tuple[torch.Tensor, float]
    qkv: list[Proj]
    qk_norm: tuple[torch.Tensor, float, torch.Tensor] | None  # Qwen3: RMSNorm over each head before RoPE
    o_proj: Proj
    post_norm: tuple[torch.Tensor, float]
    gate_up: list[Proj]
    down: Proj
    lora: LayerLora | None = None


def fuse(
    linears: list[torch.nn.Linear], fused: bool, concat: Callable[[list[torch.Tensor]], torch.Tensor] = torch.cat
) -> list[Proj]:
    """``[(weight, bias)]`` of one matmul computing all ``linears`` (their outputs side by side, the weights
    joined by ``concat``: ``torch.cat``, or a packed layout's own), or each apart when ``fused`` is False or
    only some have a bias."""
    biases = [lin.bias for lin in linears]
    if not fused or (None in biases and any(b is not None for b in biases)):
        return [(lin.weight, lin.bias) for lin in linears]
    bias = None if biases[0] is None else torch.cat(biases)
    return [(concat([lin.weight for lin in linears]), bias)]


def lora_deltas(linears: list[torch.nn.Linear], matmuls: int) -> list[LoraDelta | None] | None:
    """The deltas of ``linears`` computed by ``matmuls`` matmuls (one: fused; else one each); None when
    none of them carries a LoRA term."""
    terms = [getattr(lin, LORA_ATTR, None) for lin in linears]
    if all(t is None for t in terms):
        return None
    if matmuls == len(linears):
        return [None if t is None else LoraDelta(t.b.shape[0], t.a, (t.b * t.scaling).t().contiguous()) for t in terms]
    a = torch.cat([t.a for t in terms if t is not None])  # [R, in]: every adapted layer's A stacked
    outs = [lin.out_features for lin in linears]
    bt = a.new_zeros((a.shape[0], sum(outs)))  # block-diagonal: layer i's columns read only its own ranks
    col = rank = 0
    for t, out in zip(terms, outs, strict=True):
        if t is not None:
            r = t.a.shape[0]
            bt[rank : rank + r, col : col + out] = (t.b * t.scaling).t()
            rank += r
        col += out
    return [LoraDelta(sum(outs), a, bt)]


def bind_weights(
    model: torch.nn.Module,
    fused: bool,
    prepare: Callable[[list[Proj]], list[Proj]],
    concat: Callable[[list[torch.Tensor]], torch.Tensor] = torch.cat,
) -> list:
    """``[embed, layers, (norm_w, norm_eps, head_w, head_b), head_lora]`` for one batch: q/k/v and gate/up
    fused when ``fused`` (joined by ``concat`` unless a LoRA term extends them), every matmul's ``(weight,
    bias)`` passed through ``prepare`` (packing)."""

    def adapted(linears: list[torch.nn.Linear]) -> tuple[list[Proj], list[LoraDelta | None] | None]:
        """The group's matmuls, and their deltas (None: no adapter, the matmuls as ``proj`` gives them)."""
        plain = all(getattr(lin, LORA_ATTR, None) is None for lin in linears)
        projs = fuse(linears, fused, concat if plain else torch.cat)  # a delta extends a plain [out, in] weight
        deltas = lora_deltas(linears, len(projs))
        if deltas is None:
            return prepare(projs), None
        return prepare([p if d is None else d.extend(p) for p, d in zip(projs, deltas, strict=True)]), deltas

    layers = []
    for block in model.model.layers:
        attn, mlp = block.self_attn, block.mlp
        qk_norm = (attn.q_norm.weight, attn.q_norm.variance_epsilon, attn.k_norm.weight) if hasattr(attn, "q_norm") else None
        groups = [adapted(g) for g in ([attn.q_proj, attn.k_proj, attn.v_proj], [attn.o_proj],
                                       [mlp.gate_proj, mlp.up_proj], [mlp.down_proj])]  # fmt: skip
        (qkv, qkv_d), (o_proj, o_d), (gate_up, gate_up_d), (down, down_d) = groups
        lora = None
        if any(d is not None for _, d in groups):
            lora = LayerLora(qkv=qkv_d or [None] * len(qkv), o_proj=o_d and o_d[0],
                             gate_up=gate_up_d or [None] * len(gate_up), down=down_d and down_d[0])  # fmt: skip
        layers.append(LayerWeights(
            input_norm=(block.input_layernorm.weight, block.input_layernorm.variance_epsilon),
            qkv=qkv,
            qk_norm=qk_norm,
            o_proj=o_proj[0],
            post_norm=(block.post_attention_layernorm.weight, block.post_attention_layernorm.variance_epsilon),
            gate_up=gate_up,
            down=down[0],
            lora=lora,
        ))  # fmt: skip
    inner = model.model
    head_p, head_d = adapted([model.lm_head])
    head = (inner.norm.weight, inner.norm.variance_epsilon, *head_p[0])
    return [inner.embed_tokens.weight, layers, head, None if head_d is None else head_d[0]]
