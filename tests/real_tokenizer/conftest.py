"""Fixtures of the real-tokenizer tests: SmolLM2-135M-Instruct's BPE tokenizer (shipped under
``tests/fixtures/smollm2_tokenizer``) and a real model of its vocabulary that samples chosen ids."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.real_tokenizer.ids import SUCCESSORS, TOKENIZER_DIR


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from ludic.testing.real_tokenizer import load_tokenizer

    return load_tokenizer(TOKENIZER_DIR)


@pytest.fixture(scope="session")
def successor_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real model with SmolLM2's tokenizer that answers every prompt with ``HELLO_WORLD`` + eos."""
    from ludic.testing.real_tokenizer import build_successor_model

    return build_successor_model(tmp_path_factory.mktemp("successor"), TOKENIZER_DIR, SUCCESSORS)


@pytest.fixture(scope="module")
def successor_url(successor_dir: Path) -> Iterator[str]:
    """The OpenAI-compatible base URL of Ludic's server (a subprocess on loopback) serving the successor model."""
    from ludic.testing.server_process import running_server

    with running_server(successor_dir) as url:
        yield url + "/v1"
