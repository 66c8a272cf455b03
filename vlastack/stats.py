"""Small statistics shared across layers (the evaluator's intervals, ``vla doctor --run``'s)."""

from __future__ import annotations

import math


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials (95% for z = 1.96)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # The closed form's bound at k == n (k == 0) is 1 (0) exactly, but rounds to 0.9999999999999999:
    # pin it, so an interval always contains its own rate (a plot's error bar is never negative).
    lo = 0.0 if k == 0 else max(0.0, mid - half)
    hi = 1.0 if k == n else min(1.0, mid + half)
    return (min(lo, p), max(hi, p))
