"""Every file path that the code, docs and README name in backticks is in this repository.

A comment or doc pointing at a file the reader cannot open (notes kept outside the repository, a module
since renamed) sends them nowhere. Paths resolve against the repository root, ``src/``, ``src/ludic/``,
``examples/``, ``tests/`` or the naming file's own folder; outputs a run writes (``runs/...``) and other
projects' files are listed below with the reason.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEARCHED = ("src", "examples", "bench", "docs", "environments", "tests")
PATH_IN_BACKTICKS = re.compile(r"`{1,2}([\w.\-]+(?:/[\w.\-]+)+\.(?:py|md|sh|toml|yaml|yml|txt|json))`{1,2}")
NOT_IN_THIS_REPOSITORY = {
    "entrypoints/serve/rlhf/api_router.py": "vLLM's own source, cited for its routes",
}


def _named_paths() -> list[tuple[Path, str]]:
    files = [p for d in SEARCHED for p in (ROOT / d).rglob("*") if p.suffix in (".py", ".md")]
    files.append(ROOT / "README.md")
    return [(f, m.group(1)) for f in files for m in PATH_IN_BACKTICKS.finditer(f.read_text(errors="ignore"))]


def _exists(path: str, named_in: Path) -> bool:
    bases = (ROOT, ROOT / "src", ROOT / "src" / "ludic", ROOT / "examples", ROOT / "tests", named_in.parent)
    return any((base / path).exists() for base in bases)


def test_every_path_named_in_code_and_docs_is_in_the_repository() -> None:
    named = _named_paths()
    assert len(named) > 50  # the pattern still finds the references it is meant to check
    missing = sorted(
        f"{path} (named in {file.relative_to(ROOT)})"
        for file, path in named
        if not _exists(path, file) and path not in NOT_IN_THIS_REPOSITORY and not path.startswith("runs/")
    )
    assert not missing, "paths named but not in the repository:\n" + "\n".join(missing)
