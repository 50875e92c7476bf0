"""Head-major records: one byte order for a block's KV, whatever the tensor-parallel size.

A worker's part of a host-pool row is a run of ``units`` equal pieces (one per layer and block
of the chunk, in the worker's order), and where the engine's pages are head-major
(``[heads, tokens, K|V]``: vLLM's ``LBHNC`` layout, the only one of its CPU backend) each piece
is the worker's heads one after another, ``part`` bytes each. A model's KV heads are split
between the ranks in order, so the same piece of every rank, taken in rank order, is that
piece's KV for every head in head order: the bytes a tensor-parallel size 1 engine holds.

The record of a row is that order, piece by piece::

    | piece 0: slice 0 | slice 1 | ... | piece 1: slice 0 | slice 1 | ... |

where slice ``i`` is the ``i``-th distinct head slice (ranks that replicate a head hold the
same bytes; one copy is kept). An engine of any TP size writes, and reads, the record a TP=1
engine's row is: a TP=4 reader of a TP=2 writer's block reads its head out of the part that
held two, a TP=2 reader of a TP=4 writer's block takes its two heads from two ranks' pieces.
The record is stored and checked whole (one checksum over every head): a host-pool row needs
every head of the block, so every reader reads the whole record anyway, and a damaged head
fails the whole block. Per-slice checksums would only pay for a reader that needs part of a
record, which no row does.

The cost is one copy of the row on each store and load for TP > 1 (the record is not the
row's prefix); TP = 1 records are the row itself. Pure numpy; no vLLM import.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _pieces(buffer: memoryview, start: int, size: int, units: int) -> np.ndarray:
    """``buffer[start : start + size]`` as ``units`` rows of equal bytes (no copy)."""
    flat = np.frombuffer(buffer, dtype=np.uint8, count=size, offset=start)
    return flat.reshape(units, size // units)


def interleave(
    row: memoryview,
    record: memoryview,
    segment_bytes: int,
    units: int,
    sources: Sequence[int],
) -> None:
    """Fill ``record`` (``len(sources) * segment_bytes``) piece by piece from worker parts.

    ``sources[i]``: the index of the worker part of ``row`` that holds slice ``i``."""
    part = segment_bytes // units
    out = np.frombuffer(record, dtype=np.uint8, count=len(sources) * segment_bytes)
    out3 = out.reshape(units, len(sources), part)
    for index, segment in enumerate(sources):
        out3[:, index, :] = _pieces(row, segment * segment_bytes, segment_bytes, units)


def deinterleave(
    record: memoryview,
    row: memoryview,
    segment_bytes: int,
    units: int,
    segment_slices: Sequence[int],
    slices: int,
) -> None:
    """Fill every worker part of ``row`` from ``record`` (``slices * segment_bytes``).

    ``segment_slices[s]``: the index of the slice worker part ``s`` holds."""
    part = segment_bytes // units
    source = np.frombuffer(record, dtype=np.uint8, count=slices * segment_bytes)
    source3 = source.reshape(units, slices, part)
    for segment, index in enumerate(segment_slices):
        target = _pieces(row, segment * segment_bytes, segment_bytes, units)
        target[:] = source3[:, index, :]
