"""Property-based tests of the Wilson interval against an independent solution of its defining inequality.

The Wilson interval is the set of rates ``pi`` with ``|p - pi| <= z * sqrt(pi (1 - pi) / n)``, ``p = k / n``:
the roots of ``(1 + z^2/n) pi^2 - (2p + z^2/n) pi + p^2 = 0``. It lies in [0, 1], contains ``p`` (0 and 1
included at 0 and n successes), and its half-width shrinks like ``z * sqrt(p (1 - p) / n)``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.eval import wilson

PROPS = settings()  # the suite's profile (tests/conftest.py): 200 examples, 500 under CI=true
z_values = st.floats(0.5, 4.0)


@st.composite
def counts(draw: st.DrawFn, max_n: int = 100_000) -> tuple[int, int]:
    n = draw(st.integers(1, max_n))
    k = draw(st.one_of(st.integers(0, n), st.sampled_from([0, n])))
    return k, n


@PROPS
@given(counts(), z_values)
def test_the_interval_is_the_roots_of_the_wilson_quadratic(kn: tuple[int, int], z: float) -> None:
    k, n = kn
    p, c = k / n, z * z / n
    roots = sorted(np.roots([1 + c, -(2 * p + c), p * p]).real)  # float64, by numpy's companion matrix
    assert wilson(k, n, z) == pytest.approx(roots, abs=1e-9)


@PROPS
@given(counts(), z_values)
def test_the_interval_lies_in_zero_one_and_contains_the_rate(kn: tuple[int, int], z: float) -> None:
    k, n = kn
    lo, hi = wilson(k, n, z)
    assert 0.0 <= lo <= k / n <= hi <= 1.0
    assert (lo == 0.0) == (k == 0)  # the rate can only be 0 when no trial succeeded
    assert (hi == 1.0) == (k == n)


@PROPS
@given(counts(), z_values)
def test_successes_and_failures_are_symmetric(kn: tuple[int, int], z: float) -> None:
    k, n = kn
    lo, hi = wilson(k, n, z)
    flo, fhi = wilson(n - k, n, z)
    assert [lo, hi] == pytest.approx([1 - fhi, 1 - flo], abs=1e-12)


@PROPS
@given(counts(max_n=10_000), st.integers(2, 50), z_values)
def test_more_trials_at_the_same_rate_give_a_narrower_interval(kn: tuple[int, int], m: int, z: float) -> None:
    k, n = kn
    lo, hi = wilson(k, n, z)
    mlo, mhi = wilson(m * k, m * n, z)
    assert mhi - mlo < hi - lo


@PROPS
@given(counts(), z_values)
def test_the_half_width_shrinks_like_one_over_root_n(kn: tuple[int, int], z: float) -> None:
    # half = z sqrt(pq/n + z^2/4n^2) / (1 + z^2/n), so z sqrt(pq/n) / (1 + z^2/n) <= half <= z sqrt(pq/n) + z^2/2n
    k, n = kn
    lo, hi = wilson(k, n, z)
    p = k / n
    normal = z * math.sqrt(p * (1 - p) / n)
    half = (hi - lo) / 2
    assert normal / (1 + z * z / n) - 1e-12 <= half <= normal + z * z / (2 * n) + 1e-12


def test_no_trials_is_uninformative() -> None:
    assert wilson(0, 0) == [0.0, 1.0]  # documented: an evaluation with no finished game says nothing


@pytest.mark.parametrize(
    ("k", "n", "match"),
    [
        (5, 4, "k=5, n=4"),
        (-1, 4, "k=-1"),
        (0, -1, "n=-1"),
        (2.5, 5, "k and n must be integers"),
        (2, 5.0, "k and n must be integers"),
        ("2", 5, "k and n must be integers"),
        (None, 5, "k and n must be integers"),
    ],
)
def test_bad_counts_are_refused_naming_them(k: object, n: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        wilson(k, n)  # type: ignore[arg-type]


@pytest.mark.parametrize("z", [0.0, -1.96, math.nan, math.inf])
def test_a_non_positive_or_non_finite_z_is_refused(z: float) -> None:
    with pytest.raises(ValueError, match="z must be a positive finite number"):
        wilson(1, 2, z)


def test_numpy_integer_counts_are_accepted() -> None:
    assert wilson(np.int64(3), np.int64(10)) == wilson(3, 10)
