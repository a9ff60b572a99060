"""GGUF files into transformers folders: read and checked once, dequantized to fp32, cached by content.

transformers loads a GGUF file (``from_pretrained(folder, gguf_file=NAME)``) and dequantizes every tensor;
the result keeps a ``quantization_config`` that makes ``save_pretrained`` refuse, so it is dropped before
saving. The folder is keyed by the file's SHA-256: the same file is converted once, a changed file again.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic.models.cache import build_atomically, models_dir
from ludic.models.errors import ModelPrepError, require_gguf

GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class GgufInfo:
    """What the header of a GGUF file says (read without loading a tensor)."""

    path: Path
    architecture: str
    name: str | None
    tensors: int


def read_gguf_info(path: str | Path) -> GgufInfo:
    """Check that ``path`` is a whole GGUF file of an architecture transformers can dequantize.

    Raises ModelPrepError naming the file for a missing file, another format, a truncated or corrupt file
    (a tensor that ends past the end of the file), or an unsupported architecture."""
    p = Path(path)
    if not p.is_file():
        raise ModelPrepError(f"no such GGUF file: {str(p)!r}")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelPrepError(f"{str(p)!r} is not a GGUF file (it starts with {magic!r}, not b'GGUF')")
    require_gguf()
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(p))
        arch = _field_text(reader, "general.architecture")
        name = _field_text(reader, "general.name")
        ends = [int(t.data_offset) + int(t.n_bytes) for t in reader.tensors]
    except ModelPrepError:
        raise
    except Exception as exc:  # the reader's own errors on a damaged header (ValueError, IndexError, ...)
        raise ModelPrepError(
            f"{str(p)!r} is a truncated or corrupt GGUF file: {type(exc).__name__}: {str(exc)[:200]}"
        ) from exc
    size = p.stat().st_size
    if not ends or max(ends) > size:
        raise ModelPrepError(
            f"{str(p)!r} is truncated: its tensors need {max(ends, default=0)} bytes, the file has {size}"
        )
    if arch is None:
        raise ModelPrepError(f"{str(p)!r} names no general.architecture")
    supported = _supported_architectures()
    if arch not in supported:
        raise ModelPrepError(
            f"{str(p)!r} is a {arch!r} model; this transformers can dequantize GGUF files of "
            f"{sorted(a for a in supported if a not in ('general', 'tokenizer'))}"
        )
    return GgufInfo(p, arch, name, len(reader.tensors))


def dequantize_gguf(path: str | Path, *, cache_dir: str | Path | None = None, target: Path | None = None,
                    quiet: bool = False) -> Path:  # fmt: skip
    """The transformers folder (fp32 model, tokenizer, chat template) of the GGUF file ``path``.

    Converted once into ``<cache>/gguf/<stem>-<sha256[:12]>`` (or ``target``) and reused after that."""
    info = read_gguf_info(path)
    digest = file_sha256(info.path)
    if target is None:
        target = models_dir(cache_dir) / "gguf" / f"{info.path.stem}-{digest[:12]}"

    def build(out: Path) -> dict[str, Any]:
        started = time.perf_counter()
        if not quiet:
            size_mb = info.path.stat().st_size / 1e6
            print(f"[ludic models] dequantizing {info.path.name} ({size_mb:.0f} MB, {info.architecture}) "
                  "to fp32, once", file=sys.stderr, flush=True)  # fmt: skip
        _convert(info, out)
        seconds = time.perf_counter() - started
        if not quiet:
            print(f"[ludic models] ready in {seconds:.1f} s: {out.parent / target.name}", file=sys.stderr, flush=True)
        return {"source": str(info.path.resolve()), "sha256": digest, "architecture": info.architecture,
                "name": info.name, "dtype": "float32", "seconds": round(seconds, 2)}  # fmt: skip

    return build_atomically(target, build)


def _convert(info: GgufInfo, out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(info.path.parent), info.path.name
    with _no_loading_bars():  # one line of ours instead of three loading bars
        try:
            tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
            model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        except Exception as exc:
            raise ModelPrepError(
                f"transformers could not load {str(info.path)!r} ({info.architecture}): "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            ) from exc
        # The dequantized weights are plain fp32 tensors; only the markers of the GGUF origin block saving.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.hf_quantizer = None
        model.save_pretrained(out)
        tokenizer.save_pretrained(out)


@contextmanager
def _no_loading_bars() -> Iterator[None]:
    """transformers' own bars (hf logging) and the tqdm bar its GGUF reader opens directly (its module's
    ``tqdm`` is given ``disable=True`` for the duration)."""
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    bars, reader_bar = hf_logging.is_progress_bar_enabled(), getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if reader_bar is not None:
        gguf_utils.tqdm = functools.partial(reader_bar, disable=True)
    try:
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        if reader_bar is not None:
            gguf_utils.tqdm = reader_bar


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _field_text(reader: Any, key: str) -> str | None:
    field = reader.fields.get(key)
    if field is None:
        return None
    value = field.contents()
    if not isinstance(value, str):
        raise ModelPrepError(f"GGUF field {key} is a {type(value).__name__}, not text")
    return value


def _supported_architectures() -> set[str]:
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return set(GGUF_SUPPORTED_ARCHITECTURES)
