"""Throughput of candidate payload checksums over realistic block sizes.

Run: ``python -m benchmarks checksum [--repeats N]``. Prints a markdown table of
GB/s (10^9 bytes per second), the median of ``repeats`` timed runs, each run hashing about
256 MiB. Candidates that are not installed (``crc32c``, ``google-crc32c``) are listed as
such. Every candidate reads a writable ``memoryview``, as the store does with host-pool
rows; ``google-crc32c`` rejects writable buffers (even through ``toreadonly()``), so its row
includes the copy to ``bytes`` it would force on the store.
"""

from __future__ import annotations

import importlib
import os
import zlib
from collections.abc import Callable

import xxhash

from kvtier.bench.report import environment_line, markdown_table, median, repeat_s

BLOCK_SIZES = (64 << 10, 512 << 10, 6 << 20)
BYTES_PER_RUN = 256 << 20


def _optional(module: str, attr: str) -> Callable[[memoryview], int] | None:
    try:
        return getattr(importlib.import_module(module), attr)
    except ImportError:
        return None


def candidates() -> dict[str, Callable[[memoryview], int] | None]:
    """Name -> checksum function over a memoryview, or None when not installed."""
    google = _optional("google_crc32c", "value")
    return {
        "xxhash.xxh3_64": xxhash.xxh3_64_intdigest,
        "zlib.crc32": zlib.crc32,
        "crc32c.crc32c": _optional("crc32c", "crc32c"),
        "google_crc32c.value (+copy)": (lambda mv: google(bytes(mv))) if google else None,
    }


def gbps(fn: Callable[[memoryview], int], block_bytes: int, repeats: int) -> float:
    """Median GB/s of ``fn`` over a random block of ``block_bytes``."""
    block = memoryview(bytearray(os.urandom(block_bytes)))
    blocks_per_run = max(1, BYTES_PER_RUN // block_bytes)

    def run() -> None:
        for _ in range(blocks_per_run):
            fn(block)

    run()  # warm up
    seconds = median(repeat_s(run, repeats))
    return blocks_per_run * block_bytes / seconds / 1e9


def run(repeats: int = 7) -> str:
    """The table of GB/s per candidate and block size, with the environment line."""
    rows = []
    for name, fn in candidates().items():
        if fn is None:
            rows.append([name] + ["not installed"] * len(BLOCK_SIZES))
            continue
        rows.append([name] + [f"{gbps(fn, size, repeats):.2f}" for size in BLOCK_SIZES])
    header = ["algorithm"] + [f"{size >> 10} KiB GB/s" for size in BLOCK_SIZES]
    return (
        markdown_table(header, rows)
        + f"\n\nmedian of {repeats} runs of ~256 MiB each; {environment_line()}"
    )
