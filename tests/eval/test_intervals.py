"""The Wilson interval used for held-out win rates: known values, edges, bad input."""

from __future__ import annotations

import pytest

from ludic.eval import wilson


def test_wilson_matches_known_values() -> None:
    lo, hi = wilson(77, 256)  # the tic-tac-toe example's 0.30 after RL
    assert round(lo, 3) == 0.248 and round(hi, 3) == 0.360
    assert [round(x, 3) for x in wilson(0, 32)] == [0.0, 0.107]
    assert [round(x, 3) for x in wilson(32, 32)] == [0.893, 1.0]


def test_wilson_edges_and_bad_input() -> None:
    assert wilson(0, 0) == [0.0, 1.0]
    with pytest.raises(ValueError, match="k=5, n=4"):
        wilson(5, 4)
    with pytest.raises(ValueError, match="k=-1"):
        wilson(-1, 4)
