"""Statistics and reports every benchmark shares: summaries of repeated measurements,
markdown tables, the environment line, timing repeats and the page-cache drop.

A summary is a median with its spread (p90, p99, max, count), never a lone mean.
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; the median for 0.5.

    Raises ``ValueError`` on an empty sequence.
    """
    if not values:
        raise ValueError("quantile of no values")
    if q == 0.5:
        return statistics.median(values)
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


def median(values: Sequence[float]) -> float:
    return quantile(values, 0.5)


@dataclass(frozen=True)
class Summary:
    """Median, tail and extremes of one series of measurements."""

    count: int
    median: float
    p90: float
    p99: float
    min: float
    max: float

    def as_dict(self) -> dict[str, float]:
        return dict(vars(self))


def summarize(values: Sequence[float]) -> Summary:
    """The summary of a non-empty series (``ValueError`` on an empty one)."""
    return Summary(
        count=len(values),
        median=quantile(values, 0.5),
        p90=quantile(values, 0.9),
        p99=quantile(values, 0.99),
        min=min(values),
        max=max(values),
    )


def median_range(values: Sequence[float], digits: int = 3) -> str:
    """``1.230 (1.100–1.400)``: median and min–max; a single value alone; ``–`` for none."""
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return f"{median(values):.{digits}f} ({min(values):.{digits}f}–{max(values):.{digits}f})"


def p50_p99(values: Sequence[float], digits: int = 2) -> str:
    """``0.12 / 0.40``: median and p99 (``n/a`` for no values)."""
    if not values:
        return "n/a"
    return f"{quantile(values, 0.5):.{digits}f} / {quantile(values, 0.99):.{digits}f}"


def repeat_s(fn: Callable[[], object], repeats: int) -> list[float]:
    """Run ``fn`` ``repeats`` times; return each run's wall time in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Render a markdown table; every column after the first is right-aligned (numbers)."""
    lines = [
        "| " + " | ".join(header) + " |",
        "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
    ]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def environment_line() -> str:
    """One line naming the interpreter, kernel and CPU count, printed with every result."""
    return (
        f"python {platform.python_version()}, {platform.system()} {platform.release()}, "
        f"{platform.machine()}, {os.cpu_count()} cpus, argv: {' '.join(sys.argv)}"
    )


def drop_page_cache() -> bool:
    """Flush dirty pages and drop the page cache (root only); False when not permitted."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def decision_verdicts(metrics: dict[str, float]) -> dict[str, float]:
    """``kvtier:restore_decisions`` of one engine summed over its tiers, by verdict."""
    out: dict[str, float] = {}
    for key, value in metrics.items():
        if key.startswith("kvtier:restore_decisions{"):
            labels = dict(p.split("=", 1) for p in key[key.index("{") + 1 : -1].split(","))
            verdict = labels.get("verdict", "?").strip('"')
            out[verdict] = out.get(verdict, 0.0) + value
    return out


def counter(metrics: dict[str, float], name: str) -> float:
    """Metric ``name`` of one engine summed over its label sets."""
    return sum(v for k, v in metrics.items() if k == name or k.startswith(name + "{"))
