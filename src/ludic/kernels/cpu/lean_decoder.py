"""A lean decoding step for Llama-family models on a preallocated KV cache (the embedded engine's hot loop).

Hugging Face's forward spends most of a small model's decoding step outside the matmuls: module calls,
mask building, output dataclasses and a KV cache that grows by ``torch.cat`` (copying every row's whole
cache each step). This step calls the same weights through plain tensor ops: embedding, per layer
RMSNorm -> q/k/v -> RoPE -> write K/V at one column of a preallocated cache -> SDPA over the filled
columns -> o_proj -> RMSNorm -> SiLU MLP, then the final norm and the output layer. The ops compute
``transformers``' Qwen2/Qwen3/Llama/Mistral code value for value (same order of sums, dtypes, GQA
packing; q/k/v and gate/up as one matmul each, whose columns are the same dot products; RoPE for q and
k at once, by ``roll``), so with ``exact=True`` the logits equal the Hugging Face forward's (test). By
default, for fp32 weights on the CPU, the matmuls run through oneDNN's packed inner product instead of
the BLAS behind ``F.linear`` (on the AMD EPYC this was measured on, about 2x faster at these shapes):
another order of sums, so the logits match to fp32 rounding (within 1e-5, test) and greedy tokens
still equal ``model.generate``'s (test). The weights are read from the model's own parameters at every
batch, so an in-place weight swap (``sync_weights``) is seen by the next batch.

Attention is the cache's: ``StaticKVCache`` gives each row its own copy of the prompt's K/V and makes
transformers' SDPA call (bit for bit); ``SharedPrefixKVCache`` keeps each distinct prompt once and
attends over it once per group (cascade attention; logits to fp32 rounding).

Other architectures, rope scalings other than ``default`` and sliding windows shorter than a batch
decode through Hugging Face's forward instead (``lean_unsupported`` names why).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache
from ludic.kernels.private_ops import LINEAR_POINTWISE, REORDER_LINEAR_WEIGHT, works

SUPPORTED = ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "LlamaForCausalLM", "MistralForCausalLM")


def lean_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``model`` cannot decode through ``LeanDecoder`` (None when it can)."""
    if type(model).__name__ not in SUPPORTED:
        return f"architecture {type(model).__name__} is not one of {SUPPORTED}"
    config = model.config
    if getattr(config, "hidden_act", None) != "silu":
        return f"hidden_act {getattr(config, 'hidden_act', None)!r} is not 'silu'"
    rope = getattr(config, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        return f"rope_type {rope.get('rope_type')!r} is not 'default'"
    if getattr(config, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    return None


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, weight.shape, weight, eps)  # one fused op, bit-identical in fp32 (test)
    dtype = x.dtype  # as transformers' RMSNorm: normalise in fp32, scale in the model's dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """transformers' ``x * cos + rotate_half(x) * sin`` in four ops instead of six, bit for bit.

    ``rotate_half(x) = cat(-x2, x1)`` is ``roll(x, half)`` with its first half negated, and a sign
    flip is exact in IEEE arithmetic, so ``rotate_half(x) * sin == roll(x, half) * sin_signed`` where
    ``sin_signed`` is ``sin`` with its first half negated (``LeanDecoder.rope_tables``)."""
    rotated = torch.roll(x, x.shape[-1] // 2, dims=-1).mul_(sin_signed)
    return (x * cos).add_(rotated)


@dataclass
class StaticKVCache:
    """K and V of every layer in one preallocated tensor ``[layers, 2, rows, kv_heads, max_len, head_dim]``.

    ``valid[b, t]`` is False at left-padding columns. Rows are compacted in place (finished rows
    dropped) so the live rows are always ``[:rows]``; only the filled columns are ever read or moved.
    """

    kv: torch.Tensor
    valid: torch.Tensor
    rows: int
    padded: bool  # some live row has a padding column (else attention needs no mask)
    column: int = 0  # the column this step writes (set by ``begin``)
    mask: torch.Tensor | None = None  # this step's padding mask (None when no live row is padded)

    @classmethod
    def from_prefill(cls, cache, index: torch.Tensor, mask: torch.Tensor, max_len: int) -> StaticKVCache:
        """Copy a prefill's ``DynamicCache`` (rows fanned out by ``index``) into a cache of ``max_len`` columns."""
        first = cache.layers[0].keys
        _, heads, width, dim = first.shape
        rows = index.shape[0]
        kv = torch.empty((len(cache.layers), 2, rows, heads, max_len, dim), dtype=first.dtype, device=first.device)
        for layer, entry in enumerate(cache.layers):
            kv[layer, 0, :, :, :width] = entry.keys.index_select(0, index)
            kv[layer, 1, :, :, :width] = entry.values.index_select(0, index)
        valid = torch.ones((rows, max_len), dtype=torch.bool, device=first.device)
        valid[:, :width] = mask.bool()
        return cls(kv, valid, rows, padded=not bool(valid[:, :width].all()))

    def drop(self, done: torch.Tensor, filled: int) -> torch.Tensor | None:
        """Drop the live rows where ``done [rows]`` is True; returns each kept row's old batch position
        (None when no row is left). The last kept rows move into the holes, so only as many rows
        are copied as were dropped; only the ``filled`` columns move."""
        keep = (~done).nonzero().squeeze(-1)
        n = keep.shape[0]
        if n == 0:
            return None
        holes = done[:n].nonzero().squeeze(-1)  # dropped rows inside the kept prefix
        movers = keep[keep >= n]  # kept rows beyond it, one per hole
        order = torch.arange(n, device=done.device)
        if holes.numel():
            self.kv[:, :, holes, :, :filled] = self.kv[:, :, movers, :, :filled]
            self.valid[holes, :filled] = self.valid[movers, :filled]
            order[holes] = movers
        self.rows = n
        self.padded = not bool(self.valid[:n, :filled].all())
        return order

    def begin(self, column: int) -> None:
        """This step writes K/V at ``column`` and attends over columns ``[0, column]``."""
        self.column = column
        self.mask = self.valid[: self.rows, None, None, : column + 1] if self.padded else None

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention ``[rows, heads * head_dim]`` for ``q [rows, heads, head_dim]`` after writing ``k``/``v``
        ``[rows, kv_heads, head_dim]`` at this step's column (transformers' SDPA call, so the logits
        match bit for bit)."""
        n, heads, d = q.shape
        kv_heads = k.shape[1]
        column = self.column
        self.kv[layer, 0, :n, :, column] = k
        self.kv[layer, 1, :n, :, column] = v
        keys = self.kv[layer, 0, :n, :, : column + 1]
        values = self.kv[layer, 1, :n, :, : column + 1]
        groups = heads // kv_heads
        if groups > 1 and self.mask is None:  # transformers' choice for one query token without a mask
            out = F.scaled_dot_product_attention(q[:, :, None], keys, values, scale=scale, enable_gqa=True)
        else:  # with a mask: query heads packed onto their KV head
            out = F.scaled_dot_product_attention(q.view(n, kv_heads, groups, d), keys, values, attn_mask=self.mask, scale=scale)
        return out.reshape(n, heads * d)


@dataclass(slots=True)
class LayerWeights:
    """One decoder layer's weights as the step uses them. ``qkv`` and ``gate_up`` hold one fused
    ``(weight, bias)`` projection whose output columns are the separate projections' side by side,
    or the projections apart (see ``LeanDecoder.bind``)."""

    input_norm: tuple[torch.Tensor, float]
    qkv: list[tuple[torch.Tensor, torch.Tensor | None]]
    qk_norm: tuple[torch.Tensor, float, torch.Tensor] | None  # Qwen3: RMSNorm over each head before RoPE
    o_proj: tuple[torch.Tensor, torch.Tensor | None]
    post_norm: tuple[torch.Tensor, float]
    gate_up: list[tuple[torch.Tensor, torch.Tensor | None]]
    down: tuple[torch.Tensor, torch.Tensor | None]


def _fuse(linears: list[torch.nn.Linear], fuse: bool) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """``[(weight, bias)]`` of one matmul computing all ``linears`` (their outputs side by side), or
    each apart when ``fuse`` is False or only some have a bias."""
    biases = [lin.bias for lin in linears]
    if not fuse or (None in biases and any(b is not None for b in biases)):
        return [(lin.weight, lin.bias) for lin in linears]
    bias = None if biases[0] is None else torch.cat(biases)
    return [(torch.cat([lin.weight for lin in linears]), bias)]


def _can_pack(model: torch.nn.Module) -> bool:
    """oneDNN's packed fp32 matmul can run this model's weights (CPU, fp32, its private ops working)."""
    weight = model.lm_head.weight
    on_cpu = weight.device.type == "cpu" and weight.dtype == torch.float32 and torch.backends.mkldnn.is_available()
    return on_cpu and works(LINEAR_POINTWISE) and works(REORDER_LINEAR_WEIGHT)


def _pack(weight: torch.Tensor, bias: torch.Tensor | None, rows: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    return torch.ops.mkldnn._reorder_linear_weight(weight, rows), bias  # a copy in oneDNN's blocked layout


def _packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` with a weight from ``_pack`` (oneDNN's inner product, as inductor's CPU fusion calls it)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


class LeanDecoder:
    """One decoding step (one new token per live row) straight through a model's weights."""

    def __init__(self, model: torch.nn.Module, *, exact: bool = False, packed: bool = True) -> None:
        """``exact``: run the model's own matmuls (``F.linear``), so the logits equal its forward's bit for
        bit (with ``StaticKVCache``); otherwise, for fp32 weights on the CPU, oneDNN's packed matmuls
        (about 2x faster than the default BLAS on the AMD EPYC measured; logits to fp32 rounding),
        unless ``packed=False`` (``KernelChoice.packed_linear``)."""
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(f"LeanDecoder cannot run this model: {reason}")
        self.model = model
        self.packed = packed and not exact and _can_pack(model)
        self.linear = _packed_linear if self.packed else F.linear
        config = model.config
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.scaling = self.head_dim**-0.5
        self.inv_freq = model.model.rotary_emb.inv_freq
        self.rope_scale = float(getattr(model.model.rotary_emb, "attention_scaling", 1.0))

    def fits(self, max_len: int) -> bool:
        """False when a sliding window shorter than ``max_len`` would change attention."""
        windows = [getattr(layer.self_attn, "sliding_window", None) for layer in self.model.model.layers]
        return all(w is None or w >= max_len for w in windows)

    def rope_tables(self, max_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and ``sin_signed`` (sin with its first half negated, see ``_rope``) for positions
        ``[0, max_len)``, each ``[max_len, head_dim]`` (the rotary module's formula, position by position)."""
        positions = torch.arange(max_len, device=self.inv_freq.device, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq.to(torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = (emb.cos() * self.rope_scale).to(dtype), (emb.sin() * self.rope_scale).to(dtype)
        sin[:, : sin.shape[-1] // 2].neg_()
        return cos, sin

    def bind(self, rows: int = 32) -> list:
        """The model's current weights, looked up once for a batch of about ``rows`` rows (so a
        ``sync_weights`` between batches is seen by the next one).

        On the CPU, q/k/v and gate/up are concatenated into one matmul each (a copy of those weights
        for the batch): fewer, wider matmuls, each output column still the same dot product in the same
        order, so with ``exact`` the logits stay bit-identical to the model's forward (test). With
        ``packed``, every matmul's weight is also copied into oneDNN's layout for the batch. Elsewhere
        (nothing of this loop has run on a GPU, where a wider matmul may pick another kernel and a
        copy of the weights costs scarce memory) the projections stay apart."""
        fuse = self.inv_freq.device.type == "cpu"

        def proj(linears: list[torch.nn.Linear]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
            fused = _fuse(linears, fuse)
            return [_pack(w, b, rows) for w, b in fused] if self.packed else fused

        layers = []
        for block in self.model.model.layers:
            attn, mlp = block.self_attn, block.mlp
            qk_norm = (attn.q_norm.weight, attn.q_norm.variance_epsilon, attn.k_norm.weight) if hasattr(attn, "q_norm") else None
            layers.append(LayerWeights(
                input_norm=(block.input_layernorm.weight, block.input_layernorm.variance_epsilon),
                qkv=proj([attn.q_proj, attn.k_proj, attn.v_proj]),
                qk_norm=qk_norm,
                o_proj=proj([attn.o_proj])[0],
                post_norm=(block.post_attention_layernorm.weight, block.post_attention_layernorm.variance_epsilon),
                gate_up=proj([mlp.gate_proj, mlp.up_proj]),
                down=proj([mlp.down_proj])[0],
            ))  # fmt: skip
        inner = self.model.model
        head_w, head_b = proj([self.model.lm_head])[0]
        return [inner.embed_tokens.weight, layers, (inner.norm.weight, inner.norm.variance_epsilon, head_w, head_b)]

    def step(
        self,
        weights: list,
        tokens: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: StaticKVCache | SharedPrefixKVCache,
        column: int,
    ) -> torch.Tensor:
        """Logits ``[rows, vocab]`` after feeding ``tokens [rows]``; their K/V go to ``column`` of the cache.

        ``weights`` comes from ``bind()``; ``cos``/``sin`` ``[rows, head_dim]`` are each row's rows of
        ``rope_tables`` (cos and signed sin) at its own position.
        """
        embed, layers, (norm_w, norm_eps, head_w, head_b) = weights
        linear = self.linear
        x = F.embedding(tokens, embed)  # [n, hidden]
        cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
        cache.begin(column)
        for layer, w in enumerate(layers):
            h = _rms_norm(x, *w.input_norm)
            x = x + linear(self._attention(w, h, cos, sin, cache, layer), *w.o_proj)
            h = _rms_norm(x, *w.post_norm)
            if len(w.gate_up) == 1:
                gate, up = linear(h, *w.gate_up[0]).chunk(2, dim=-1)
            else:
                gate, up = (linear(h, *p) for p in w.gate_up)
            x = x + linear(F.silu(gate).mul_(up), *w.down)
        return linear(_rms_norm(x, norm_w, norm_eps), head_w, head_b)

    def _attention(self, w: LayerWeights, h, cos, sin, cache: StaticKVCache | SharedPrefixKVCache, layer: int):
        """Attention output ``[rows, heads * head_dim]`` (before ``o_proj``) for ``h [rows, hidden]``."""
        n, d, heads, kv_heads, linear = h.shape[0], self.head_dim, self.heads, self.kv_heads, self.linear
        if len(w.qkv) == 1:
            qkv = linear(h, *w.qkv[0]).view(n, heads + 2 * kv_heads, d)
            qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]  # q and k side by side
        else:
            q, k, v = (linear(h, *p).view(n, -1, d) for p in w.qkv)
            qk = torch.cat((q, k), dim=1)
        if w.qk_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
            q_w, eps, k_w = w.qk_norm
            qk = torch.cat((_rms_norm(qk[:, :heads], q_w, eps), _rms_norm(qk[:, heads:], k_w, eps)), dim=1)
        qk = _rope(qk, cos, sin)  # [n, heads + kv_heads, head_dim]: one rotation for q and k
        return cache.attend(layer, qk[:, :heads], qk[:, heads:], v, self.scaling)
