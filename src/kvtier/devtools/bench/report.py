"""Small helpers the benchmarks share: timing repeats, quantiles and markdown tables."""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path


def repeat_s(fn: Callable[[], object], repeats: int) -> list[float]:
    """Run ``fn`` ``repeats`` times; return each run's wall time in seconds."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` by nearest rank; the median for 0.5."""
    if q == 0.5:
        return statistics.median(values)
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))]


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
