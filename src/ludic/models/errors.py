"""The one error type of model preparation, so callers (the CLI, a config check) catch one thing."""

from __future__ import annotations


class ModelPrepError(ValueError):
    """A model source that cannot become a transformers folder: the message names the file and why."""


EXTRA = "models"
"""The optional extra that installs what preparing a GGUF model needs (the ``gguf`` package)."""


def require_gguf() -> None:
    """Import ``gguf`` (transformers' GGUF reader needs it) or say which extra installs it."""
    try:
        import gguf  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"reading GGUF files needs the 'gguf' package: pip install 'ludic[{EXTRA}]' (or pip install gguf)"
        ) from exc
