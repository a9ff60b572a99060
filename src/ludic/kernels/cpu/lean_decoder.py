"""A lean decoding step for Llama-family models on a preallocated KV cache (the embedded engine's hot loop).

Hugging Face's forward spends most of a small model's decoding step outside the matmuls: module calls,
mask building, output dataclasses and a KV cache that grows by ``torch.cat`` (copying every row's whole
cache each step). This step calls the same weights through plain tensor ops: embedding, per layer
RMSNorm -> q/k/v -> RoPE -> write K/V at one column of a preallocated cache -> SDPA over the filled
columns -> o_proj -> RMSNorm -> SiLU MLP, then the final norm and the output layer. The ops compute
``transformers``' Qwen2/Qwen3/Llama/Mistral code value for value (same order of sums, dtypes, GQA
packing; q/k/v and gate/up as one matmul each, whose columns are the same dot products; RoPE for q and
k at once, by ``roll``), so with ``exact=True`` the logits equal the Hugging Face forward's (test). By
default, for fp32 weights on the CPU, the matmuls run on packed weights instead of the BLAS behind
``F.linear``: Ludic's decoding kernel (AVX-512 or AVX2) (``decode_gemm.py``) where this machine builds it, else
oneDNN's packed inner product (on the AMD EPYC this was measured on, about 2x the BLAS at these shapes):
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

import torch
import torch.nn.functional as F

from ludic.kernels.cpu import decode_gemm, decode_layers
from ludic.kernels.cpu.lean_matmuls import (
    can_pack,
    gemm_linear,
    pack,
    pack_for_gemm,
    packed_concat,
    packed_linear,
)
from ludic.kernels.cpu.lean_weights import LayerLora, LayerWeights, LoraDelta, Proj, bind_weights
from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache
from ludic.kernels.cpu.static_kv_cache import StaticKVCache

__all__ = ["SUPPORTED", "LeanDecoder", "StaticKVCache", "lean_unsupported"]

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


def _plus(y: torch.Tensor, delta: LoraDelta | None) -> torch.Tensor:
    """A matmul's output with its LoRA delta (``LoraDelta.finish``), if it has one."""
    return y if delta is None else delta.finish(y)


class LeanDecoder:
    """One decoding step (one new token per live row) straight through a model's weights."""

    def __init__(
        self, model: torch.nn.Module, *, exact: bool = False, packed: bool = True, gemm: bool = True, layers: bool = True
    ) -> None:
        """``exact``: run the model's own matmuls (``F.linear``), so the logits equal its forward's bit for
        bit (with ``StaticKVCache``); otherwise, for fp32 weights on the CPU, packed matmuls (logits to fp32
        rounding), unless ``packed=False`` (``KernelChoice.packed_linear``): Ludic's decoding kernel (AVX-512 or AVX2)
        (``decode_gemm.py``: 1.4x oneDNN at 32 rows on the Xeon measured) where it runs and ``gemm`` is set
        (``KernelChoice.decode_gemm``), else oneDNN's (about 2x the default BLAS on the AMD EPYC measured). With
        ``gemm`` and ``layers`` (``KernelChoice.decode_layers``) a step runs every layer in one native call
        (``decode_layers.py``) where the bound layers and the cache are of the kinds it takes."""
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(f"LeanDecoder cannot run this model: {reason}")
        self.model = model
        self.packed = packed and not exact and can_pack(model)
        self.gemm = self.packed and gemm and decode_gemm.available()
        self.linear = (gemm_linear if self.gemm else packed_linear) if self.packed else F.linear
        self.native_layers = self.gemm and layers
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
        ``packed``, every matmul's weight is also copied into the packed layout (the kernel's or
        oneDNN's) for the batch. Elsewhere (nothing of this loop has run on a GPU, where a wider matmul
        may pick another kernel and a copy of the weights costs scarce memory) the projections stay apart. Layers serving an unmerged
        LoRA adapter bring their deltas (``lean_weights``; logits then to fp32 rounding, even ``exact``)."""
        fused = self.inv_freq.device.type == "cpu"

        def prepare(projs: list[Proj]) -> list[Proj]:
            if not self.packed:
                return projs
            packer = pack_for_gemm if self.gemm else pack
            return [(w, b) if w.dim() == 3 else packer(w, b, rows) for w, b in projs]  # 3-D: packed while fused

        return bind_weights(self.model, fused, prepare, concat=packed_concat if self.gemm else torch.cat)

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
        embed, layers, (norm_w, norm_eps, head_w, head_b), head_lora = weights
        linear = self.linear
        x = F.embedding(tokens, embed)  # [n, hidden]
        table = self._layer_table(layers, cache)
        if table is not None:  # every layer in one native call
            x = decode_layers.run(table, x, cos, sin, cache, column)
        else:
            x = self._layers(layers, x, cos, sin, cache, column)
        logits = linear(_rms_norm(x, norm_w, norm_eps), head_w, head_b)
        return logits if head_lora is None else head_lora.finish(logits).contiguous()

    def _layer_table(self, layers: list[LayerWeights], cache: StaticKVCache | SharedPrefixKVCache):
        """``decode_layers``' table for this batch's layers and cache (built at its first step and kept on the
        cache, with the layers it was built for), or None: the Python loop runs."""
        if not self.native_layers or not isinstance(cache, SharedPrefixKVCache):
            return None
        if cache.layer_table_for is not layers:  # a new batch, or weights bound again mid-batch
            cache.layer_table = decode_layers.layer_table(
                layers, cache, heads=self.heads, kv_heads=self.kv_heads, head_dim=self.head_dim, scale=self.scaling
            )
            cache.layer_table_for = layers
        return cache.layer_table

    def _layers(self, layers: list[LayerWeights], x, cos, sin, cache: StaticKVCache | SharedPrefixKVCache, column: int):
        """``x`` through every layer, op by op."""
        linear = self.linear
        cos, sin = cos[:, None, :], sin[:, None, :]  # broadcast over heads
        cache.begin(column)
        for layer, w in enumerate(layers):
            if w.lora is not None:  # an adapter served unmerged: the same step, plus its deltas
                x = self._lora_layer(w, w.lora, x, cos, sin, cache, layer)
                continue
            h = _rms_norm(x, *w.input_norm)
            x = x + linear(self._attention(w, h, cos, sin, cache, layer), *w.o_proj)
            h = _rms_norm(x, *w.post_norm)
            if len(w.gate_up) == 1:
                gate, up = linear(h, *w.gate_up[0]).chunk(2, dim=-1)
            else:
                gate, up = (linear(h, *p) for p in w.gate_up)
            x = x + linear(F.silu(gate).mul_(up), *w.down)
        return x

    def _lora_layer(self, w: LayerWeights, lora: LayerLora, x, cos, sin, cache, layer: int) -> torch.Tensor:
        """``step``'s layer with each matmul's LoRA delta added to its output (``LoraDelta.finish``)."""
        linear = self.linear
        h = _rms_norm(x, *w.input_norm)
        x = x + _plus(linear(self._attention(w, h, cos, sin, cache, layer, lora.qkv), *w.o_proj), lora.o_proj)
        h = _rms_norm(x, *w.post_norm)
        gate_up = [_plus(linear(h, *p), d) for p, d in zip(w.gate_up, lora.gate_up, strict=True)]
        gate, up = gate_up[0].chunk(2, dim=-1) if len(gate_up) == 1 else gate_up
        return x + _plus(linear(F.silu(gate).mul_(up), *w.down), lora.down)

    def _attention(self, w: LayerWeights, h, cos, sin, cache: StaticKVCache | SharedPrefixKVCache, layer: int,
                   lora: list[LoraDelta | None] | None = None):
        """Attention output ``[rows, heads * head_dim]`` (before ``o_proj``) for ``h [rows, hidden]``;
        ``lora``: the q/k/v matmuls' deltas (``LayerLora.qkv``)."""
        n, d, heads, kv_heads, linear = h.shape[0], self.head_dim, self.heads, self.kv_heads, self.linear
        if len(w.qkv) == 1:
            qkv = linear(h, *w.qkv[0]) if lora is None else _plus(linear(h, *w.qkv[0]), lora[0])
            qkv = qkv.view(n, heads + 2 * kv_heads, d)
            qk, v = qkv[:, : heads + kv_heads], qkv[:, heads + kv_heads :]  # q and k side by side
        else:
            outs = [linear(h, *p) for p in w.qkv]
            outs = outs if lora is None else [_plus(y, dl) for y, dl in zip(outs, lora, strict=True)]
            q, k, v = (y.view(n, -1, d) for y in outs)
            qk = torch.cat((q, k), dim=1)
        if w.qk_norm is not None:  # Qwen3: RMSNorm over each head before RoPE
            q_w, eps, k_w = w.qk_norm
            qk = torch.cat((_rms_norm(qk[:, :heads], q_w, eps), _rms_norm(qk[:, heads:], k_w, eps)), dim=1)
        qk = _rope(qk, cos, sin)  # [n, heads + kv_heads, head_dim]: one rotation for q and k
        return cache.attend(layer, qk[:, :heads], qk[:, heads:], v, self.scaling)
