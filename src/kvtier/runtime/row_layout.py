"""What a host-pool row holds, rank by rank, and the record a tier keeps of it.

vLLM's host-pool row is one chunk of blocks of every worker, in rank order::

    | worker 0's pages | worker 1's pages | ... | worker n-1's pages | pad |

(one copy only when vLLM keeps a replicated layout: a pure-MLA model). Each worker's part
holds the KV of the heads it serves. With ``H`` KV heads and tensor-parallel size ``t``,
rank ``r`` holds heads ``[r*H/t, (r+1)*H/t)`` when ``H >= t``; when ``H < t`` heads are
replicated and rank ``r`` holds head ``r*H//t``; an MLA model's single latent is on every rank.
Two workers holding the same head slice, with the same per-block layout, hold the same bytes.

So a tier's record is not the row but its *distinct* slices: a TP=2 engine of a 1-KV-head
model stores one copy of head 0, the same record a TP=1 engine stores. Where the engine's pages
are head-major and every piece of a worker part can be placed (``head_major_units``: vLLM's
``LBHNC`` layout, unpadded pages of one head size), the record interleaves the slices piece by
piece (``kvtier.dataplane.head_major``): every head of every layer in head order, the bytes a
TP=1 engine's row holds. Engines of every TP size then write and read one record, in one
namespace (the TP=1 engine's): a TP=4 reader of a TP=2 writer's block takes its head out of
the part that held two, a TP=2 reader of a TP=4 writer's block its two heads from two parts.
Otherwise the record is the distinct slices one after another, in order of first appearance
(TP=2 and TP=4 of a 2-KV-head model both store ``[head 0 | head 1]``), and the namespace
names those slices (``RowLayout.slices``) instead of the world size and rank: equal slices
share records across TP sizes and different slices never meet (a clean miss).

Where the slices cannot be stated faithfully (pipeline, context or decode-context parallel
layouts, a world that is not the TP group, an unknown head count, a head count that does not
divide the TP size, a row that does not split into equal worker parts) every worker is its
own slice named by its rank and topology: records then cross nothing, as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvtier.dataplane.head_major import deinterleave, interleave
from kvtier.hostpool.sizing import DTYPE_BYTES


@dataclass(frozen=True)
class RowLayout:
    """How one host-pool row maps to one record (``gather``) and back (``scatter``)."""

    #: Bytes of one worker's part of a row (its pages of every KV tensor, a chunk of blocks).
    segment_bytes: int
    #: For each worker part of the row, in rank order: the index of its slice in ``slices``.
    segment_slices: tuple[int, ...]
    #: The distinct slices, in order of first appearance (head order where named by heads);
    #: the record holds one part each.
    slices: tuple[str, ...]
    #: Head-major pieces of one worker part (``kvtier.dataplane.head_major``): the record
    #: interleaves the slices piece by piece. 0: the slices one after another.
    units: int = 0
    #: What the record holds, as the namespace names it: every head (``kv heads 0-H of H``)
    #: for a head-major record; "" for the slices themselves.
    record_slices: str = ""

    @property
    def record_bytes(self) -> int:
        """Payload bytes of the record of one row."""
        return len(self.slices) * self.segment_bytes

    @property
    def interleaved(self) -> bool:
        """True when the record interleaves several slices (head-major, TP > 1)."""
        return self.units > 0 and len(self.slices) > 1

    @property
    def named_slices(self) -> str:
        """The namespace's name of what the record holds."""
        return self.record_slices or " | ".join(self.slices)

    @property
    def named_slice_bytes(self) -> int:
        """The namespace's bytes of one named slice: the whole record when head-major."""
        return self.record_bytes if self.record_slices else self.segment_bytes

    @property
    def is_prefix(self) -> bool:
        """True when the record is the row's first ``record_bytes`` (no slice repeats, no
        interleaving): stores and loads need no copy of their own."""
        return not self.interleaved and self.segment_slices == tuple(
            range(len(self.segment_slices))
        )

    def gather(self, row: memoryview, record: memoryview) -> None:
        """Copy the first worker part of each slice of ``row`` into ``record``."""
        size = self.segment_bytes
        if self.interleaved:
            interleave(row, record, size, self.units, self._first_segments())
            return
        for index, segment in enumerate(self._first_segments()):
            record[index * size : (index + 1) * size] = row[segment * size : (segment + 1) * size]

    def scatter(self, record: memoryview, row: memoryview) -> None:
        """Copy each slice of ``record`` into every worker part of ``row`` that holds it."""
        size = self.segment_bytes
        if self.interleaved:
            deinterleave(record, row, size, self.units, self.segment_slices, len(self.slices))
            return
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
    head_units: int = 0,
) -> RowLayout:
    """The layout of one row of an engine with ``parallel`` (``OffloadingParallelConfig``).

    ``worker_bytes_per_chunk``: one worker's KV bytes of a chunk; ``replicated``: vLLM keeps
    one copy for every worker (``spec.replicated_layout``); ``pool_row_bytes``: the row's
    stride, padding included; ``head_units``: the head-major pieces of a worker part
    (``head_major_units``), 0 where they cannot be placed. A row that does not split into
    worker parts is one slice, the whole row, named by the topology (what the tier stored
    before slices were named).
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
    units, record_slices = 0, ""
    if slices is None:
        slices = _by_rank(parallel, segments)
    elif not latent and head_units > 0 and worker_bytes_per_chunk % head_units == 0:
        # Named by heads, in head order: the record can hold every head, head-major.
        units, record_slices = head_units, f"kv heads 0-{kv_heads} of {kv_heads}"
    distinct = list(dict.fromkeys(slices))
    return RowLayout(
        worker_bytes_per_chunk,
        tuple(distinct.index(s) for s in slices),
        tuple(distinct),
        units,
        record_slices,
    )


#: Bytes of one element of the KV cache dtypes vLLM names (``OffloadingModelConfig.dtype``):
#: the sizing table's, and the torch names of the 8-bit types a page may hold.
_DTYPE_BYTES = {**DTYPE_BYTES, "float8_e4m3fn": 1, "float8_e5m2": 1, "int8": 1, "uint8": 1}


def head_major_units(
    kv_cache_layout: str | None,
    dtype: str,
    tokens_per_block: Sequence[int],
    layers: int,
    kv_heads: int,
    head_size: int,
    tp_size: int,
    worker_bytes_per_block: int,
    blocks_per_chunk: int,
) -> int:
    """Head-major pieces of one worker part of a row, or 0 where they cannot be placed.

    Only vLLM's ``LBHNC`` layout keeps a page's heads outermost (``[heads, tokens, K|V]``),
    and only where a worker's bytes per block are exactly its layers' unpadded pages of one
    head size (``layers * heads * tokens * 2 * head_size * dtype``) is every piece known to be
    the worker's heads one after another: padded pages, K and V of different sizes, layers of
    different shapes or an unknown dtype leave the record as the slices (0).
    """
    element = _DTYPE_BYTES.get(dtype.removeprefix("torch."), 0)
    if kv_cache_layout != "LBHNC" or element == 0 or len(set(tokens_per_block)) != 1:
        return 0
    if layers <= 0 or kv_heads <= 0 or head_size <= 0 or tp_size <= 0:
        return 0
    heads_per_rank = max(1, kv_heads // tp_size)
    page = heads_per_rank * tokens_per_block[0] * 2 * head_size * element
    if worker_bytes_per_block != layers * page:
        return 0
    return layers * max(blocks_per_chunk, 1)
