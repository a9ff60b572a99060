"""Shared pytest set-up: tensor shapes are checked at run time; ``gpu`` tests skip without CUDA; shared fixtures."""

import os
from pathlib import Path

# Before anything imports ludic: @shape_checked functions check their jaxtyping annotations with
# beartype (ludic.training.shapes), so a wrong shape fails where it enters, naming the dimension.
os.environ.setdefault("LUDIC_CHECK_SHAPES", "1")

import pytest
import torch


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny model directories, built once per test module, that differ in every weight.

    ``dirs[0]`` (seed 0) is the one a test serves; ``dirs[1]`` (seed 7) the weights it publishes.
    """
    from ludic.testing import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    return build_tiny_model(root / "a", seed=0), build_tiny_model(root / "b", seed=7)
