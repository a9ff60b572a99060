"""Tensor shapes in annotations (jaxtyping), checked at run time (beartype) when ``LUDIC_CHECK_SHAPES=1``.

The hot path (collation, log-probs, losses) annotates its tensors as ``Float[Tensor, "B T"]`` and
wraps the function in ``@shape_checked``. With checking on, a call whose tensors disagree (logits
``[B, T, V]`` against input ids ``[B, T']``) fails at that function with a ``TypeCheckError`` that names
the dimension and the sizes seen; with it off (the default outside the test suite) the decorator
returns the function unchanged, so training pays nothing. Set the environment variable before
``ludic`` is imported: ``LUDIC_CHECK_SHAPES=1 ludic train run.toml``. The test suite turns it on
(``tests/conftest.py``). Dimension names: B sequences, T positions, V vocabulary.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

from jaxtyping import Bool, Float, Int, Shaped, jaxtyped
from torch import Tensor

__all__ = ["CHECK_SHAPES", "Bool", "Float", "Int", "Shaped", "Tensor", "shape_checked"]

CHECK_SHAPES = os.environ.get("LUDIC_CHECK_SHAPES", "").strip().lower() in ("1", "true", "yes", "on")
"""Read once, at import: whether ``@shape_checked`` functions check their annotated shapes."""

F = TypeVar("F", bound=Callable)


def shape_checked(fn: F) -> F:
    """``fn`` checked by ``jaxtyped(typechecker=beartype)`` when ``LUDIC_CHECK_SHAPES`` is on, else ``fn``."""
    if not CHECK_SHAPES:
        return fn
    from beartype import beartype

    return jaxtyped(typechecker=beartype)(fn)  # type: ignore[return-value]
