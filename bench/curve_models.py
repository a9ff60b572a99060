"""The TRL curve's three tiny Qwen2 sizes: one table for every bench that measures them."""

from __future__ import annotations

SIZES: dict[str, dict[str, int]] = {  # name: ludic.testing.build_tiny_model keywords
    "0.8M": dict(hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=384),
    "6M": dict(hidden_size=256, num_layers=8, num_heads=4, num_kv_heads=2, intermediate_size=768),
    "25M": dict(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, intermediate_size=1536),
}


def qwen2_config(size: str) -> dict[str, int]:
    """The same size as ``transformers.Qwen2Config`` keywords."""
    s = SIZES[size]
    return dict(
        hidden_size=s["hidden_size"], num_hidden_layers=s["num_layers"], num_attention_heads=s["num_heads"],
        num_key_value_heads=s["num_kv_heads"], intermediate_size=s["intermediate_size"],
    )  # fmt: skip
