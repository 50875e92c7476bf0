"""Byte placement of engine KV blocks in host-pool rows.

This is the one place that decides which bytes of the host pool a given engine block occupies.
It follows upstream's layout exactly (``vllm/v1/kv_offload/cpu/gpu_worker.py``:
``compute_sub_block_ptrs`` and ``SingleDirectionOffloadingHandler.transfer_async``), so host rows
and the tier files written from them mean the same bytes on every platform:

* every canonical KV tensor ``t`` has a host view of shape
  ``(num_chunks, page_t * blocks_per_chunk)`` with row stride ``row_stride`` (the whole aligned
  chunk row: all ranks, all tensors);
* sub-block ``j`` of chunk ``c`` of tensor ``t`` starts at ``host_base_t + c * row_stride +
  j * page_t``;
* per KV group with ``n`` engine blocks whose first logical block index is ``k``, the host side
  skips ``k % blocks_per_chunk`` sub-blocks of its first chunk and consumes
  ``ceil((n + skip) / blocks_per_chunk)`` chunk ids; the engine side is one block per id.

Pure numpy; no vLLM or torch import, so it can be tested against upstream's function directly.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class TensorPlacement:
    """Where one canonical KV tensor lives on both sides."""

    engine_base: int  # address of engine block 0 of this tensor
    engine_stride: int  # bytes between consecutive engine blocks
    host_base: int  # address of this tensor's slot in host chunk row 0
    host_stride: int  # bytes between consecutive host chunk rows
    page_bytes: int  # padded bytes per engine block (host sub-block pitch)


@dataclass(frozen=True, slots=True)
class CopyRef:
    """One layer (or aliased layer set) of a KV group: which tensor, how many bytes per block."""

    tensor_idx: int
    copy_bytes: int  # unpadded bytes per block actually copied


@dataclass(frozen=True, slots=True)
class CopyPlan:
    """Flat list of memory copies ``dst[i] <- src[i]`` of ``sizes[i]`` bytes."""

    src: np.ndarray  # uint64 addresses
    dst: np.ndarray  # uint64 addresses
    sizes: np.ndarray  # uint64 byte counts

    @property
    def total_bytes(self) -> int:
        return int(self.sizes.sum())


def host_sub_block_offsets(
    chunk_ids: np.ndarray, blocks_per_chunk: int, count: int, skip: int, row_stride: int, page: int
) -> np.ndarray:
    """Byte offsets (from the tensor's host base) of ``count`` consecutive sub-blocks.

    Sub-blocks are enumerated chunk by chunk, starting ``skip`` sub-blocks into the first chunk.
    """
    if skip >= blocks_per_chunk or skip < 0:
        raise ValueError(f"skip={skip} must be in [0, blocks_per_chunk={blocks_per_chunk})")
    positions = np.arange(skip, skip + count, dtype=np.uint64)
    chunk_idx = positions // np.uint64(blocks_per_chunk)
    within = positions % np.uint64(blocks_per_chunk)
    chunks = chunk_ids.astype(np.uint64)[chunk_idx.astype(np.int64)]
    return chunks * np.uint64(row_stride) + within * np.uint64(page)


def plan_copies(
    tensors: Sequence[TensorPlacement],
    group_refs: Sequence[Sequence[CopyRef]],
    blocks_per_chunk: int,
    engine_block_ids: np.ndarray,
    group_sizes: Sequence[int],
    block_indices: Sequence[int],
    chunk_ids: np.ndarray,
    to_host: bool,
) -> CopyPlan:
    """Plan the copies of one transfer between engine blocks and host chunks.

    ``engine_block_ids`` are ordered by group (``sum(group_sizes)`` of them); ``chunk_ids`` are
    consumed per group as described in the module docstring. Raises ``ValueError`` when the ids
    do not add up, which would mean the scheduler and worker disagree on the layout.
    """
    if len(group_sizes) != len(group_refs) or len(block_indices) != len(group_refs):
        raise ValueError(
            f"{len(group_sizes)} group sizes / {len(block_indices)} block indices for "
            f"{len(group_refs)} offloaded KV groups"
        )
    srcs: list[np.ndarray] = []
    dsts: list[np.ndarray] = []
    sizes: list[np.ndarray] = []
    engine_pos = 0
    chunk_pos = 0
    for refs, n, first_idx in zip(group_refs, group_sizes, block_indices, strict=True):
        if n == 0:
            continue
        skip = first_idx % blocks_per_chunk
        n_chunks = -(-(n + skip) // blocks_per_chunk)
        group_blocks = engine_block_ids[engine_pos : engine_pos + n].astype(np.uint64)
        group_chunks = chunk_ids[chunk_pos : chunk_pos + n_chunks]
        if len(group_blocks) != n or len(group_chunks) != n_chunks:
            raise ValueError(
                f"transfer ids run short: group needs {n} engine blocks and {n_chunks} chunks, "
                f"got {len(group_blocks)} and {len(group_chunks)}"
            )
        engine_pos += n
        chunk_pos += n_chunks
        for ref in refs:
            t = tensors[ref.tensor_idx]
            engine_addr = np.uint64(t.engine_base) + group_blocks * np.uint64(t.engine_stride)
            host_addr = np.uint64(t.host_base) + host_sub_block_offsets(
                group_chunks, blocks_per_chunk, n, skip, t.host_stride, t.page_bytes
            )
            srcs.append(engine_addr if to_host else host_addr)
            dsts.append(host_addr if to_host else engine_addr)
            sizes.append(np.full(n, ref.copy_bytes, dtype=np.uint64))
    if engine_pos != len(engine_block_ids) or chunk_pos != len(chunk_ids):
        raise ValueError(
            f"transfer ids left over: used {engine_pos}/{len(engine_block_ids)} engine blocks and "
            f"{chunk_pos}/{len(chunk_ids)} chunks"
        )
    if not srcs:
        empty = np.empty(0, dtype=np.uint64)
        return CopyPlan(empty, empty, empty)
    return CopyPlan(np.concatenate(srcs), np.concatenate(dsts), np.concatenate(sizes))
