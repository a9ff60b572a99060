"""A decoding KV cache that keeps each distinct prompt's K/V once and attends over it once per group.

A GRPO batch sends every prompt G times. Fanning the prompt's K/V out to each row (``StaticKVCache``)
makes every decoding step read that prompt G times per layer; on a CPU a decoding step is bound by
memory reads (the weights and the KV cache), so at 32 rows x 70 prompt tokens those copies cost as
much as the weights. Here (cascade attention, as in FlashInfer's shared-prefix kernels) the prompts'
K/V stay in one tensor per layer ``[prompts, kv_heads, width, head_dim]`` from the prefill, and each
row has its own preallocated suffix ``[rows, kv_heads, max_new, head_dim]`` for the tokens it decodes.

Per layer, for query ``q [rows, kv_heads, groups, head_dim]`` (query heads packed on their KV head),
attention over the prompt and over the row's own suffix run apart and merge by their log-sum-exps:

    o_pre, l_pre = attn(q[r], K_pre[prompt(r)], V_pre[prompt(r)], pad_bias[prompt(r)])   (one call, all prompts)
    o_suf, l_suf = attn(q[r], K_suf[r], V_suf[r])                                        (per row)
    out[r] = (e^l_pre o_pre + e^l_suf o_suf) / (e^l_pre + e^l_suf)    = softmax over both parts at once

The prompt part runs on a slot layout ``[prompts, kv_heads, slots * groups, head_dim]`` (row ``r``
sits at slot ``slot(r)`` of its prompt; slots of finished rows hold stale queries, whose output is ignored),
so each prompt's K/V is read once per step whatever the group size. The sums run in another order
than one SDPA call's, so logits match the fanned-out path to fp32 rounding (about 1e-6, test), not
bit for bit. CPU only (the kernel returning the log-sum-exp is the CPU one); other devices fan out.

With ``native=True`` (``KernelChoice.decode_attention``) a layer's attention is one call of Ludic's own
kernel instead (``decode_attention.py``: both parts in one softmax, the step's K/V written in the same call),
where it takes the heads' shape.
"""

from __future__ import annotations

import torch

from ludic.kernels.cpu import decode_attention


class SharedPrefixKVCache:
    """Prompt K/V once per distinct prompt plus a per-row suffix; live rows are always ``[:rows]``."""

    def __init__(
        self, cache, index: torch.Tensor, prompt_mask: torch.Tensor, max_new: int, *, native: bool = False, groups: int = 1
    ) -> None:
        """``cache``: the prefill's ``DynamicCache`` (one row per distinct prompt, left-padded);
        ``index [rows]``: each row's prompt; ``prompt_mask [prompts, width]``: 1 at real tokens; ``native``:
        attend through ``decode_attention`` where it takes ``groups`` query heads per KV head."""
        first = cache.layers[0].keys
        prompts, kv_heads, width, dim = first.shape
        self.native = native and first.dtype == torch.float32 and decode_attention.supports(dim, groups) and (
            decode_attention.available()
        )
        self.prefix = [  # each [P, kvh, W, d]; contiguous for the kernel (transformers caches V as a transposed view)
            (entry.keys.contiguous(), entry.values.contiguous()) if self.native else (entry.keys, entry.values)
            for entry in cache.layers
        ]
        rows = index.shape[0]
        self.suffix = first.new_empty((len(cache.layers), 2, rows, kv_heads, max_new, dim))
        counts = torch.bincount(index, minlength=prompts)
        self.slots = int(counts.max())
        # row r's slot within its prompt: how many earlier rows share its prompt
        same = index[:, None] == index[None, :]
        slot = torch.tril(same, diagonal=-1).sum(-1)
        self.prompt, self.slot = index.to(torch.int64, copy=True), slot
        bias = torch.zeros((prompts, width), dtype=first.dtype, device=first.device)
        self.pad_rows = bias.masked_fill(prompt_mask == 0, float("-inf"))  # [P, W]
        self.pad_bias = self.pad_rows[:, None, None, :]  # [P, 1, 1, W]
        self.rows, self.width = rows, width
        self.column = 0  # the suffix column this step writes
        self.q_slots: torch.Tensor | None = None  # [prompts, kv_heads, slots, groups, head_dim], made by attend
        # decode_layers' pointers into this cache and the bound layers it was built for (LeanDecoder._layer_table)
        self.layer_table: object | None = None
        self.layer_table_for: object | None = None

    def begin(self, column: int) -> None:
        """This step writes the token at ``column`` (counted from the prompts' first column, as in
        ``StaticKVCache``) and attends over the prompt and the suffix up to it."""
        self.column = column - self.width
        if self.native:  # the kernel finds each row's prompt itself: the slot layout below is the SDPA path's
            return
        # where each live row's queries sit in the slot layout, viewed as [prompts * kv_heads * slots, ...]:
        # row r, KV head j -> (prompt(r) * kv_heads + j) * slots + slot(r); the same for every layer
        kv_heads = self.suffix.shape[3]
        n = self.rows
        heads = torch.arange(kv_heads, device=self.prompt.device)
        self.slot_index = ((self.prompt[:n, None] * kv_heads + heads) * self.slots + self.slot[:n, None]).view(-1)
        self.query_index = self.prompt[:n] * self.slots + self.slot[:n]  # row r -> its query slot [prompts * slots]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """Attention output ``[rows, heads * head_dim]`` for ``q [rows, heads, head_dim]``; ``k``/``v``
        ``[rows, kv_heads, head_dim]`` are this step's, written to the suffix first."""
        n, heads, dim = q.shape
        kv_heads = k.shape[1]
        groups = heads // kv_heads
        col = self.column
        if self.native:
            k_pre, v_pre = self.prefix[layer]
            return decode_attention.attend(
                q, k, v, k_pre, v_pre, self.pad_rows, self.prompt[:n], self.suffix[layer, 0], self.suffix[layer, 1], col, scale
            )
        q = q.view(n, kv_heads, groups, dim)  # query head h reads KV head h // groups
        self.suffix[layer, 0, :n, :, col] = k
        self.suffix[layer, 1, :n, :, col] = v
        k_pre, v_pre = self.prefix[layer]
        k_suf = self.suffix[layer, 0, :n, :, : col + 1]
        v_suf = self.suffix[layer, 1, :n, :, : col + 1]
        prompts = k_pre.shape[0]
        if self.q_slots is None:  # slots of rows that are not live keep stale (finite) queries, never read
            self.q_slots = q.new_zeros((prompts, kv_heads, self.slots, groups, dim))
        q_flat = self.q_slots.view(-1, groups * dim)
        q_flat.index_copy_(0, self.slot_index, q.reshape(n * kv_heads, groups * dim))
        q_slots = self.q_slots.view(prompts, kv_heads, -1, dim)
        out_pre, lse_pre = _attention_with_lse(q_slots, k_pre, v_pre, self.pad_bias, scale)
        out_pre = out_pre.reshape(-1, groups * dim).index_select(0, self.slot_index).view(n, kv_heads, groups, dim)
        # the log-sum-exp comes out [prompts, kv_heads, slots * groups] with KV heads innermost in memory
        lse_pre = lse_pre.transpose(1, 2).reshape(prompts * self.slots, groups, kv_heads)
        lse_pre = lse_pre.index_select(0, self.query_index).transpose(1, 2)  # [n, kv_heads, groups]
        out_suf, lse_suf = _attention_with_lse(q, k_suf, v_suf, None, scale)
        # softmax over both parts = the parts' softmaxes weighted by exp(lse_part) / (exp(lse_pre) + exp(lse_suf))
        share_pre = torch.sigmoid(lse_pre - lse_suf)[..., None].to(out_suf.dtype)
        return torch.lerp(out_suf, out_pre, share_pre).view(n, heads * dim)

    def drop(self, done: torch.Tensor, filled: int) -> torch.Tensor | None:
        """Drop the live rows where ``done [rows]`` is True (as ``StaticKVCache.drop``): the last kept
        rows move into the holes, only their suffix columns below ``filled``; the prompts never move."""
        keep = (~done).nonzero().squeeze(-1)
        n, filled = keep.shape[0], filled - self.width
        if n == 0:
            return None
        holes = done[:n].nonzero().squeeze(-1)
        movers = keep[keep >= n]
        order = torch.arange(n, device=done.device)
        if holes.numel():
            self.suffix[:, :, holes, :, :filled] = self.suffix[:, :, movers, :, :filled]
            self.prompt[holes], self.slot[holes] = self.prompt[movers], self.slot[movers]
            order[holes] = movers
        self.rows = n
        return order


def _attention_with_lse(q, k, v, bias, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(q k^T * scale + bias) v and the rows' log-sum-exp (the CPU flash-attention kernel behind
    ``F.scaled_dot_product_attention``, which returns both)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias, scale=scale)
    return out, lse
