"""Confidence intervals for held-out rates, so "before -> after" claims carry their uncertainty."""

from __future__ import annotations

import math


def wilson(k: int, n: int, z: float = 1.96) -> list[float]:
    """Wilson score interval (95% at z=1.96) for ``k`` successes in ``n`` independent trials (games).

    Wilson rather than the normal approximation: it stays inside [0, 1] and is sound at rates near 0,
    where a small model starts. ``n == 0`` gives the uninformative ``[0, 1]``.
    """
    if n < 0 or not 0 <= k <= n:
        raise ValueError(f"wilson: need 0 <= k <= n, got k={k}, n={n}")
    if n == 0:
        return [0.0, 1.0]
    p, d = k / n, 1 + z * z / n
    centre, half = (p + z * z / (2 * n)) / d, z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / d
    return [max(0.0, centre - half), min(1.0, centre + half)]
