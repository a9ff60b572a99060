"""Shared pytest set-up: tensor shapes are checked at run time; ``gpu`` tests skip without CUDA."""

import os

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
