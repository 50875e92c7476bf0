"""What a host-pool row holds, rank by rank, and the record a tier keeps of it.

vLLM's host-pool row is one chunk of blocks of every worker, in rank order::

    | worker 0's pages | worker 1's pages | ... | worker n-1's pages | pad |

(one copy only when vLLM keeps a replicated layout: a pure-MLA model). Each worker's part
holds the KV of the heads it serves. With ``H`` KV heads and tensor-parallel size ``t``,
rank ``r`` holds heads ``[r*H/t, (r+1)*H/t)`` when ``H >= t``; when ``H < t`` heads are
replicated and rank ``r`` holds head ``r*H//t``; an MLA model's single latent is on every rank.
Two workers holding the same head slice, with the same per-block layout, hold the same bytes.

So a tier's record is not the row but its *distinct* slices, in order of first appearance:
a TP=2 engine of a 1-KV-head model stores one copy of head 0, the same record a TP=1 engine
stores; TP=2 and TP=4 of a 2-KV-head model both store ``[head 0 | head 1]``. The namespace
names the slices (``RowLayout.slices``) instead of the world size and rank, so equal slices
share records across TP sizes and different slices never meet (a clean miss). A TP=1 engine
of a 2-KV-head model holds heads 0-1 interleaved in one page: another slice, another
namespace.

Where the slices cannot be stated faithfully (pipeline, context or decode-context parallel
layouts, a world that is not the TP group, an unknown head count, a head count that does not
divide the TP size, a row that does not split into equal worker parts) every worker is its
own slice named by its rank and topology: records then cross nothing, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RowLayout:
    """How one host-pool row maps to one record (``gather``) and back (``scatter``)."""

    #: Bytes of one worker's part of a row (its pages of every KV tensor, a chunk of blocks).
    segment_bytes: int
    #: For each worker part of the row, in rank order: the index of its slice in ``slices``.
    segment_slices: tuple[int, ...]
    #: The distinct slices, in order of first appearance; the record holds one part each.
    slices: tuple[str, ...]

    @property
    def record_bytes(self) -> int:
        """Payload bytes of the record of one row."""
        return len(self.slices) * self.segment_bytes

    @property
    def is_prefix(self) -> bool:
        """True when the record is the row's first ``record_bytes`` (no slice repeats):
        stores and loads need no copy of their own."""
        return self.segment_slices == tuple(range(len(self.segment_slices)))

    def gather(self, row: memoryview, record: memoryview) -> None:
        """Copy the first worker part of each slice of ``row`` into ``record``."""
        size = self.segment_bytes
        for index, segment in enumerate(self._first_segments()):
            record[index * size : (index + 1) * size] = row[segment * size : (segment + 1) * size]

    def scatter(self, record: memoryview, row: memoryview) -> None:
        """Copy each slice of ``record`` into every worker part of ``row`` that holds it."""
        size = self.segment_bytes
        for segment, index in enumerate(self.segment_slices):
            row[segment * size : (segment + 1) * size] = record[index * size : (index + 1) * size]

    def _first_segments(self) -> list[int]:
        return [self.segment_slices.index(i) for i in range(len(self.slices))]


def head_slices(kv_heads: int, tp_size: int, latent: bool) -> list[str] | None:
    """Each TP rank's slice of the model's KV, by rank; None when it cannot be stated."""
    if tp_size <= 0:
        return None
    if latent:
        return ["latent"] * tp_size  # MLA: one latent, the same on every rank
    if kv_heads <= 0:
        return None
    if kv_heads >= tp_size:
        if kv_heads % tp_size:
            return None
        step = kv_heads // tp_size
        return [f"kv heads {r * step}-{(r + 1) * step} of {kv_heads}" for r in range(tp_size)]
    if tp_size % kv_heads:
        return None
    # Replicated heads: vLLM gives rank r head r // (t / H), i.e. r * H // t.
    heads = [r * kv_heads // tp_size for r in range(tp_size)]
    return [f"kv heads {h}-{h + 1} of {kv_heads}" for h in heads]


def _by_rank(parallel: Any, segments: int) -> list[str]:
    topology = (
        f"tp {parallel.tp_size} pp {parallel.pp_size} pcp {parallel.pcp_size} "
        f"dcp {parallel.dcp_size}"
    )
    return [f"rank {r} of {parallel.world_size} ({topology})" for r in range(segments)]


def row_layout(
    parallel: Any,
    worker_bytes_per_chunk: int,
    replicated: bool,
    pool_row_bytes: int,
    kv_heads: int,
    latent: bool,
) -> RowLayout:
    """The layout of one row of an engine with ``parallel`` (``OffloadingParallelConfig``).

    ``worker_bytes_per_chunk``: one worker's KV bytes of a chunk; ``replicated``: vLLM keeps
    one copy for every worker (``spec.replicated_layout``); ``pool_row_bytes``: the row's
    stride, padding included. A row that does not split into worker parts is one slice, the
    whole row, named by the topology (what the tier stored before slices were named).
    """
    world = max(int(parallel.world_size), 1)
    segments = 1 if replicated else world
    if worker_bytes_per_chunk <= 0 or segments * worker_bytes_per_chunk > pool_row_bytes:
        labels = _by_rank(parallel, 1)
        return RowLayout(pool_row_bytes, (0,), (f"whole row: {labels[0]}",))
    slices: list[str] | None = None
    tp_only = parallel.pp_size == parallel.pcp_size == parallel.dcp_size == 1
    if tp_only and world == parallel.tp_size:
        slices = head_slices(kv_heads, parallel.tp_size, latent)
        if slices is not None and replicated:
            # One copy for every rank: faithful only when every rank holds the same slice.
            slices = slices[:1] if len(set(slices)) == 1 else None
    if slices is None:
        slices = _by_rank(parallel, segments)
    distinct = list(dict.fromkeys(slices))
    return RowLayout(
        worker_bytes_per_chunk, tuple(distinct.index(s) for s in slices), tuple(distinct)
    )
