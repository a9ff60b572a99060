"""Confidence intervals for held-out rates, so "before -> after" claims carry their uncertainty."""

from __future__ import annotations

import math
from numbers import Integral


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """Wilson score interval (95% at z=1.96) for ``k`` successes in ``n`` independent trials (games).

    Wilson rather than the normal approximation: it stays inside [0, 1] and is sound at rates near 0,
    where a small model starts. ``n == 0`` gives the uninformative ``[0, 1]``. Raises ValueError unless
    ``k`` and ``n`` are integers with ``0 <= k <= n`` and ``z`` is a positive finite number.
    """
    if not isinstance(k, Integral) or not isinstance(n, Integral):
        raise ValueError(f"wilson: k and n must be integers (counts of trials), got k={k!r}, n={n!r}")
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    if not (isinstance(z, int | float) and math.isfinite(z) and z > 0):
        raise ValueError(f"wilson: z must be a positive finite number (1.96 for 95%), got z={z!r}")
    if n == 0:
        return [0.0, 1.0]
    # centre = (p + z^2/2n) / (1 + z^2/n), half = z sqrt(p(1-p)/n + z^2/4n^2) / (1 + z^2/n)
    p, d = k / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    # the exact interval contains p; clamping to it removes rounding (centre - half was 3e-17 at k=0, n=11,
    # and centre + half 1 - 1e-16 at k=n=6), so 0 and n successes reach 0 and 1 exactly
    return [min(max(0.0, centre - half), p), max(min(1.0, centre + half), p)]
