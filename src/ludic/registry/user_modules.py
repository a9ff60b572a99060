"""Import the user's own modules so their envs, harnesses, protocols and algorithms register themselves.

``ludic train / eval / list`` call :func:`import_user_modules` with the config's ``imports`` and the
``--import`` flags before any registry is read. Only the modules named are imported (importing runs
their code: the user asked for it by naming them). A name is either a dotted module name
(``my_pkg.envs``), found on ``sys.path`` plus the config file's folder and the current folder, or a
path to a ``.py`` file (relative to the config file's folder for config entries, to the current
folder for flags). A module that cannot be imported, raises, or calls ``sys.exit`` while importing is a
:class:`UserImportError` naming it (``KeyboardInterrupt`` still interrupts: the CLI exits 130 on it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from ludic.registry.core import Registry


class UserImportError(Exception):
    """A module the user named could not be imported (the message names it and says why)."""


def import_user_modules(names: Iterable[str], *, base_dir: str | Path = ".") -> list[ModuleType]:
    """Import each name once, in order; a file path is resolved against ``base_dir``."""
    base = Path(base_dir).resolve()
    _extend_path([base, Path.cwd().resolve()])
    modules: list[ModuleType] = []
    for name in dict.fromkeys(names):  # each once, in the order given
        modules.append(_import_one(name, base))
    return modules


def is_file_name(name: str) -> bool:
    """A path to a .py file (rather than a dotted module name)."""
    return name.endswith(".py") or "/" in name or "\\" in name


def _extend_path(dirs: list[Path]) -> None:
    """Append (never prepend: installed packages are not shadowed) the folders a bare name may live in."""
    for d in dirs:
        if str(d) not in sys.path:
            sys.path.append(str(d))


def _import_one(name: str, base: Path) -> ModuleType:
    """Import ``name``; when it fails, what it registered before failing is unregistered again."""
    if not isinstance(name, str) or not name.strip():
        raise UserImportError(f"imports: {name!r} is not a module name or .py path")
    registries = _registries()
    saved = [dict(r._entries) for r in registries]
    try:
        return _import_checked(name, base)
    except BaseException:
        for registry, entries in zip(registries, saved):
            registry._entries = entries
        raise


def _registries() -> list[Registry]:
    from ludic.registry import ALGORITHM_REGISTRY, ENV_REGISTRY, HARNESS_REGISTRY, PROTOCOL_REGISTRY

    return [ENV_REGISTRY, HARNESS_REGISTRY, PROTOCOL_REGISTRY, ALGORITHM_REGISTRY]


def _import_checked(name: str, base: Path) -> ModuleType:
    try:
        return _import_file(base / name) if is_file_name(name) else importlib.import_module(name)
    except UserImportError:
        raise
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise UserImportError(
                f"imports: cannot import {name!r}: no module named {exc.name!r} on sys.path, in the config "
                f"file's folder ({base}) or the current folder; give a dotted module name or a .py path"
            ) from exc
        raise UserImportError(f"imports: importing {name!r} failed: {_where(exc)}") from exc
    except Exception as exc:  # the user's module raised while running: name it and say where
        raise UserImportError(f"imports: importing {name!r} failed: {_where(exc)}") from exc
    except SystemExit as exc:  # sys.exit() at import: the run would end silently, with its exit code
        raise UserImportError(
            f"imports: importing {name!r} called sys.exit({exc.code!r}){_at(exc)}; "
            "a module named in imports must not exit when imported"
        ) from exc


def _import_file(path: Path) -> ModuleType:
    """Import a .py file under its stem (reused when that file is already imported)."""
    path = path.resolve()
    if path.suffix != ".py" or not path.is_file():
        raise UserImportError(f"imports: {str(path)!r} is not a .py file")
    stem = path.stem
    loaded = sys.modules.get(stem)
    if loaded is not None:
        if Path(getattr(loaded, "__file__", "") or "").resolve() == path:
            return loaded
        raise UserImportError(
            f"imports: {str(path)!r} would be imported as {stem!r}, which is already the module "
            f"{getattr(loaded, '__file__', None) or stem!r}; rename the file"
        )
    _extend_path([path.parent])  # so the file's own sibling imports work
    spec = importlib.util.spec_from_file_location(stem, path)
    if spec is None or spec.loader is None:
        raise UserImportError(f"imports: cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[stem]  # a failed import leaves nothing behind
        raise
    return module


def _where(exc: BaseException) -> str:
    """``ValueError: bad (my_envs.py:12)``: the error and the innermost frame it came from."""
    return f"{type(exc).__name__}: {exc}{_at(exc)}"


def _at(exc: BaseException) -> str:
    """`` (my_envs.py:12)``: the innermost frame ``exc`` came from ('' when none)."""
    frames = traceback.extract_tb(exc.__traceback__)
    return f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
