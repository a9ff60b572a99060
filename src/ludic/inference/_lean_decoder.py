"""A lean decoding step for Llama-family models on a preallocated KV cache (the embedded engine's hot loop).

Hugging Face's forward spends most of a small model's decoding step outside the matmuls: module calls,
mask building, output dataclasses and a KV cache that grows by ``torch.cat`` (copying every row's whole
cache each step). This step calls the same weights through plain tensor ops: embedding, per layer
RMSNorm -> q/k/v -> RoPE -> write K/V at one column of a preallocated cache -> SDPA over the filled
columns -> o_proj -> RMSNorm -> SiLU MLP, then the final norm and the output layer. The ops mirror
``transformers``' Qwen2/Qwen3/Llama/Mistral code one for one (same order, dtypes, GQA packing), so the
logits equal the Hugging Face forward's (test). The weights are read from the model's own parameters
at every batch, so an in-place weight swap (``sync_weights``) is seen by the next batch.

Attention is the cache's: ``StaticKVCache`` gives each row its own copy of the prompt's K/V and makes
transformers' SDPA call (logits bit for bit); ``SharedPrefixKVCache`` keeps each distinct prompt once
and attends over it once per group (cascade attention; logits to fp32 rounding).

Other architectures, rope scalings other than ``default`` and sliding windows shorter than a batch
decode through Hugging Face's forward instead (``lean_unsupported`` names why).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ludic.inference._shared_prefix_cache import SharedPrefixKVCache

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


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


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
        """Attention for ``q [rows, heads, 1, head_dim]`` after writing ``k``/``v`` ``[rows, kv_heads, 1,
        head_dim]`` at this step's column (transformers' SDPA call, so the logits match bit for bit)."""
        n, heads, _, d = q.shape
        kv_heads = k.shape[1]
        column = self.column
        self.kv[layer, 0, :n, :, column : column + 1] = k
        self.kv[layer, 1, :n, :, column : column + 1] = v
        keys = self.kv[layer, 0, :n, :, : column + 1]
        values = self.kv[layer, 1, :n, :, : column + 1]
        groups = heads // kv_heads
        if groups > 1 and self.mask is None:  # transformers' choice for one query token without a mask
            return F.scaled_dot_product_attention(q, keys, values, scale=scale, enable_gqa=True)
        q = q.reshape(n, kv_heads, groups, d)  # with a mask: query heads packed onto their KV head
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=self.mask, scale=scale)


class LeanDecoder:
    """One decoding step (one new token per live row) straight through a model's weights."""

    def __init__(self, model: torch.nn.Module) -> None:
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(f"LeanDecoder cannot run this model: {reason}")
        self.model = model
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
        """cos/sin for positions ``[0, max_len)`` (the rotary module's formula, position by position)."""
        positions = torch.arange(max_len, device=self.inv_freq.device, dtype=torch.float32)
        freqs = positions[:, None] * self.inv_freq.to(torch.float32)[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scale).to(dtype), (emb.sin() * self.rope_scale).to(dtype)

    def bind(self) -> list[tuple]:
        """The model's current weight tensors, per layer, looked up once for a whole batch."""
        layers = []
        for block in self.model.model.layers:
            attn, mlp = block.self_attn, block.mlp
            qk_norm = (attn.q_norm.weight, attn.q_norm.variance_epsilon, attn.k_norm.weight) if hasattr(attn, "q_norm") else None
            layers.append((
                block.input_layernorm.weight, block.input_layernorm.variance_epsilon,
                attn.q_proj.weight, attn.q_proj.bias, attn.k_proj.weight, attn.k_proj.bias,
                attn.v_proj.weight, attn.v_proj.bias, attn.o_proj.weight, attn.o_proj.bias, qk_norm,
                block.post_attention_layernorm.weight, block.post_attention_layernorm.variance_epsilon,
                mlp.gate_proj.weight, mlp.gate_proj.bias, mlp.up_proj.weight, mlp.up_proj.bias,
                mlp.down_proj.weight, mlp.down_proj.bias,
            ))  # fmt: skip
        inner = self.model.model
        head = (inner.norm.weight, inner.norm.variance_epsilon, self.model.lm_head.weight, self.model.lm_head.bias)
        return [inner.embed_tokens.weight, layers, head]

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

        ``weights`` comes from ``bind()``; ``cos``/``sin`` ``[rows, head_dim]`` are each row's rotary
        values at its own position.
        """
        embed, layers, (norm_w, norm_eps, head_w, head_b) = weights
        x = F.embedding(tokens[:, None], embed)  # [n, 1, hidden]
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        cache.begin(column)
        for layer, w in enumerate(layers):
            h = _rms_norm(x, w[0], w[1])
            x = x + self._attention(w, h, cos, sin, cache, layer)
            h = _rms_norm(x, w[11], w[12])
            gate, up = F.linear(h, w[13], w[14]), F.linear(h, w[15], w[16])
            x = x + F.linear(F.silu(gate) * up, w[17], w[18])
        x = _rms_norm(x, norm_w, norm_eps)
        return F.linear(x[:, -1, :], head_w, head_b)

    def _attention(self, w, h, cos, sin, cache: StaticKVCache | SharedPrefixKVCache, layer: int):
        n, d = h.shape[0], self.head_dim
        q = F.linear(h, w[2], w[3]).view(n, 1, -1, d)
        k = F.linear(h, w[4], w[5]).view(n, 1, -1, d)
        v = F.linear(h, w[6], w[7]).view(n, 1, -1, d)
        if w[10] is not None:  # Qwen3: RMSNorm over each head before RoPE
            q_w, eps, k_w = w[10]
            q, k = _rms_norm(q, q_w, eps), _rms_norm(k, k_w, eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [n, heads, 1, head_dim]
        q = (q * cos) + (_rotate_half(q) * sin)
        k = (k * cos) + (_rotate_half(k) * sin)
        out = cache.attend(layer, q, k, v, self.scaling)
        out = out.reshape(n, -1, 1, d).transpose(1, 2).contiguous()
        return F.linear(out.reshape(n, 1, -1).contiguous(), w[8], w[9])
