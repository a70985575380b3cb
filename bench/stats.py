"""The bench's arithmetic: percentiles, ratios, pass rules. Pure functions, tested alone."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) with linear interpolation (numpy's default method).

    ``None`` for no values: a figure that was not measured must not read as 0 ms.
    """
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile q={q} outside 0..100")
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def median(values: Iterable[float]) -> float | None:
    return percentile(values, 50.0)


def summary(values: Sequence[float], prefix: str, *, qs: Sequence[int] = (50, 95)) -> dict[str, float | int | None]:
    """``{prefix_p50: .., prefix_p95: .., prefix_n: ..}`` rounded to 0.1 (figures are in ms)."""
    out: dict[str, float | int | None] = {f"{prefix}_p{q}": rnd(percentile(values, q)) for q in qs}
    out[f"{prefix}_n"] = len(values)
    return out


def rnd(x: float | None, digits: int = 1) -> float | None:
    return None if x is None else round(x, digits)


def ratio(num: float | None, den: float | None) -> float | None:
    """``num / den``, or ``None`` when either is unknown or the denominator is not positive."""
    if num is None or den is None or den <= 0:
        return None
    return num / den


def ratio_within(num: float | None, den: float | None, limit: float) -> bool:
    """``num / den <= limit``; an unknown ratio does not pass."""
    r = ratio(num, den)
    return r is not None and r <= limit


def cdf(values: Iterable[float]) -> tuple[list[float], list[float]]:
    """Sorted values and their cumulative fractions (for a step plot)."""
    xs = sorted(values)
    n = len(xs)
    return xs, [(i + 1) / n for i in range(n)]


def gaps(times: Sequence[float]) -> list[float]:
    """Differences between consecutive arrival times."""
    return [b - a for a, b in itertools.pairwise(times)]


def within(num: float | None, den: float | None, limit: float, slack: float = 0.0) -> bool:
    """``num <= limit * den`` or ``num <= den + slack`` (absolute slack for small, noisy figures)."""
    if num is None or den is None or den <= 0:
        return False
    return num <= max(limit * den, den + slack)
