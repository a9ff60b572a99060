"""The embedded engine: a Hugging Face causal LM served in-process as a ChatClient."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ludic._lazy import lazy_exports

if TYPE_CHECKING:
    from ludic.inference.embedded.transformers_client import TransformersChatClient

__all__ = [
    "TransformersChatClient",
]

__getattr__, __dir__ = lazy_exports(__name__)
