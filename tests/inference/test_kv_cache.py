"""The preallocated KV cache gives the logits of transformers' own cache, row drops and growth included."""

from __future__ import annotations

import torch
from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

from ludic.inference._kv_cache import PreallocatedLayer, preallocated_cache


def decode(model, cache, steps: int, drop_at: int) -> list[torch.Tensor]:
    """Prefill 3 left-padded rows, decode greedily, drop row 1 after ``drop_at`` steps."""
    ids = torch.tensor([[0, 0, 5, 6, 7], [9, 8, 7, 6, 5], [0, 11, 12, 13, 14]])
    mask = (ids != 0).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    out = model(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=True)
    logits, seen = [out.logits[:, -1]], []
    next_pos = pos[:, -1:] + 1
    for step in range(steps):
        tok = logits[-1].argmax(-1, keepdim=True)
        seen.append(tok)
        if step == drop_at:
            keep = torch.tensor([0, 2])
            cache.batch_select_indices(keep)
            tok, mask, next_pos = tok[keep], mask[keep], next_pos[keep]
        mask = torch.cat([mask, torch.ones_like(tok)], dim=-1)
        out = model(input_ids=tok, attention_mask=mask, position_ids=next_pos, past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
        next_pos = next_pos + 1
    return logits


@torch.inference_mode()
def test_preallocated_cache_decodes_like_the_dynamic_cache_through_drops_and_growth():
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2)
    ).eval()  # fmt: skip
    want = decode(model, DynamicCache(config=model.config), steps=8, drop_at=3)
    cache = preallocated_cache(model.config, capacity=7)  # 5 prompt + 2: must grow mid-run
    assert all(isinstance(layer, PreallocatedLayer) for layer in cache.layers)
    got = decode(model, cache, steps=8, drop_at=3)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
    assert cache.get_seq_length() == 13 and cache.layers[0].keys.shape[0] == 2
