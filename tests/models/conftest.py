"""The real GGUF file the set-up pulls (``ludic models pull smollm2-135m-instruct`` in scripts/setup.sh)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    from ludic.models import catalogue_entry, models_dir
    from ludic.models.cache import is_prepared
    from ludic.models.pull import prepared_path

    entry = catalogue_entry("smollm2-135m-instruct")
    path = models_dir() / "files" / Path(entry.member).name
    if not path.is_file() or not is_prepared(prepared_path(entry.name)):
        pytest.fail(f"{path} is missing: bash scripts/setup.sh pulls it (ludic models pull {entry.name})")
    return path
