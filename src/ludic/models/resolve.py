"""A model source as a user writes it (a folder, a GGUF file, a catalogue name) to a transformers folder."""

from __future__ import annotations

from pathlib import Path

from ludic.models.cache import is_prepared
from ludic.models.catalogue import CATALOGUE
from ludic.models.errors import ModelPrepError
from ludic.models.gguf_file import dequantize_gguf, read_gguf_info
from ludic.models.pull import prepared_path, pull_model


def is_gguf_path(source: str | Path) -> bool:
    return str(source).lower().endswith(".gguf")


def prepare_model(source: str | Path, *, cache_dir: str | Path | None = None, quiet: bool = False) -> str:
    """The transformers folder for ``source``, preparing it once when needed.

    - a ``.gguf`` file: dequantized into the cache (``ludic.models.dequantize_gguf``);
    - a catalogue name (``ludic models list``) that is not a local path: pulled and prepared;
    - anything else (a folder, a hub name): returned unchanged for ``from_pretrained``."""
    text = str(source)
    if is_gguf_path(text):
        return str(dequantize_gguf(text, cache_dir=cache_dir, quiet=quiet))
    if text in CATALOGUE and not Path(text).exists():
        return str(pull_model(text, cache_dir=cache_dir, quiet=quiet))
    return text


def model_source_errors(source: str | Path, key: str = "[model].path") -> list[str]:
    """What is wrong with ``source`` as a model, checked without converting anything (``--dry-run``)."""
    text = str(source)
    try:
        if is_gguf_path(text):
            read_gguf_info(text)
        elif text in CATALOGUE and not Path(text).exists() and not is_prepared(prepared_path(text)):
            return []  # pulled at the start of the run (``ludic models pull`` does it ahead of time)
    except (ModelPrepError, ImportError) as exc:
        return [f"{key}: {exc}"]
    return []
