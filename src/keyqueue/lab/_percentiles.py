"""Nearest-rank percentiles, the one definition every demonstration uses.

The p-th percentile of n samples is the sample at rank ceil(p/100 x n) in
sorted order: always one of the samples, never an interpolation, so a p99 is a
wait that really happened. ``percentiles`` gives the firehose's (and the
pipeline's) p50/p95/p99, ``None`` without samples; ``percentile`` one value,
0 without samples (the fairness tables).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Percentiles", "percentile", "percentiles"]


@dataclass(frozen=True, slots=True)
class Percentiles:
    """Nearest-rank percentiles in seconds; None without samples."""

    count: int
    p50: float | None
    p95: float | None
    p99: float | None


def _rank(ordered: Sequence[float], p: float) -> float:
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


def percentiles(samples: Sequence[float]) -> Percentiles:
    """p50, p95 and p99 of ``samples``, and how many there were."""
    if not samples:
        return Percentiles(0, None, None, None)
    ordered = sorted(samples)
    return Percentiles(len(ordered), _rank(ordered, 50), _rank(ordered, 95), _rank(ordered, 99))


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (0 for no values)."""
    if not values:
        return 0.0
    return _rank(sorted(values), q)
