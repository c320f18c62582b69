"""Summaries of repeated measurements: median and min-max, never a mean of noisy rounds."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")


def summary(values: Sequence[float], digits: int = 3) -> dict[str, Any]:
    """``{"median", "min", "max", "n", "values"}`` of ``values`` (rounded)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0, "values": []}
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
        "values": [round(v, digits) for v in values],
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by nearest rank."""
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def ratios(top: Sequence[float], bottom: Sequence[float]) -> list[float]:
    """Per-round ratios ``top[i] / bottom[i]`` (both measured in the same round)."""
    return [t / b for t, b in zip(top, bottom, strict=True) if b]


def rotated(items: Sequence[T], round_: int) -> list[T]:
    """``items`` starting at ``round_`` (modulo their number): each round runs them in an order of its own."""
    start = round_ % len(items)
    return [*items[start:], *items[:start]]


def span(s: dict[str, Any], fmt: str = "{:.3f}") -> str:
    """``median (min-max)`` as text."""
    if s.get("median") is None:
        return "n/a"
    return f"{fmt.format(s['median'])} ({fmt.format(s['min'])}-{fmt.format(s['max'])})"
