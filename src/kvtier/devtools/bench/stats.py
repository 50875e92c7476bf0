"""Summaries of repeated measurements: median with min-max, never a lone mean."""

import statistics
from collections.abc import Sequence


def median_range(values: Sequence[float]) -> str:
    """``1.23 (1.10–1.40)``; a single value is shown alone."""
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.3f}"
    return f"{med:.3f} ({min(values):.3f}–{max(values):.3f})"


def median(values: Sequence[float]) -> float:
    return statistics.median(values)
