"""``MlxOffloadingWorker``: moves KV blocks between an MLX paged cache and the host pool.

vLLM's connector calls the worker's ``OffloadingWorker`` methods; this one copies with MLX
operations (``kvtier.mlx.block_copy``) into and out of the rows of kvtier's host pool, in the
byte order ``kvtier.mlx.layouts`` defines, at the places ``kvtier.mlx.transfer_plan`` computes.

Transfers run synchronously inside ``submit_store`` / ``submit_load``, on the caller's thread:
MLX's arrays belong to the engine's thread and stream, and a copy must be ordered with the
engine's own writes to the cache (a store reads what the step wrote, a load must land before
the next forward reads it); a background thread would need both fences, which MLX's CPU backend
cannot show to be right here. A job is therefore done when its submit returns, ``wait`` has
nothing to wait for, and ``get_finished`` reports each job once.

A transfer is copied at most ``staging_bytes`` of one array at a time, so the MLX and NumPy
buffers it needs besides the pool stay bounded (the memory budget counts them,
``kvtier.mlx.memory_budget``).
"""

import logging
import os
import time
from collections.abc import Sequence

import numpy as np
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from kvtier.mlx.block_copy import gather_blocks, scatter_blocks
from kvtier.mlx.layouts import ArraySlot, block_bytes
from kvtier.mlx.transfer_plan import BlockMoves, plan_moves
from kvtier.vllm.release import current

logger = logging.getLogger(__name__)


class MlxOffloadingWorker(OffloadingWorker):
    """``OffloadingWorker`` over the arrays ``slots`` of an MLX paged KV cache.

    Owns ``region`` (the host pool's mapping) and releases it in ``shutdown``. Bad ids in a
    transfer raise ``ValueError`` before any byte moves.
    """

    def __init__(
        self,
        slots: Sequence[ArraySlot],
        blocks_per_chunk: int,
        region: SharedOffloadRegion,
        staging_bytes: int,
    ) -> None:
        if not slots:
            raise ValueError("an MLX cache with no arrays has nothing to offload")
        self._slots = list(slots)
        self._region = region
        self._blocks_per_chunk = blocks_per_chunk
        self._num_blocks = int(self._slots[0].get().shape[0])
        pages = [block_bytes(slot.get()) for slot in self._slots]
        #: Bytes of one engine block over every array (one block of each).
        self.block_bytes = sum(pages)
        # Per array: its slot of every host row as (rows, blocks_per_chunk, page) uint8, a view
        # of the mapping (no copy; the strides step over the other arrays' slots).
        self._host: list[np.ndarray] = []
        for page in pages:
            view = region.create_next_worker_view(page * blocks_per_chunk).numpy().view(np.uint8)
            row_stride = view.strides[0]
            self._host.append(
                np.lib.stride_tricks.as_strided(
                    view,
                    shape=(region.num_chunks, blocks_per_chunk, page),
                    strides=(row_stride, page, 1),
                )
            )
        self._batch_blocks = max(1, staging_bytes // max(pages))
        self._finished: list[TransferResult] = []
        logger.info(
            "kvtier MLX worker: %d arrays, %d engine blocks of %d B, %d blocks per chunk, "
            "%d host rows, at most %d blocks per copy",
            len(self._slots),
            self._num_blocks,
            self.block_bytes,
            blocks_per_chunk,
            region.num_chunks,
            self._batch_blocks,
        )

    def _moves(self, engine_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec) -> BlockMoves:
        if not isinstance(engine_spec, GPULoadStoreSpec):
            raise TypeError(f"engine-side spec must be a GPULoadStoreSpec, got {engine_spec!r}")
        if not isinstance(host_spec, BlockIDsLoadStoreSpec):
            raise TypeError(f"host-side spec must carry row ids, got {type(host_spec).__name__}")
        return plan_moves(
            engine_spec.block_ids,
            engine_spec.group_sizes,
            engine_spec.block_indices,
            host_spec.block_ids,
            self._blocks_per_chunk,
            self._num_blocks,
            self._region.num_chunks,
        )

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        moves = self._moves(src_spec, dst_spec)
        start = time.perf_counter()
        for batch in moves.batches(self._batch_blocks):
            for slot, host in zip(self._slots, self._host, strict=True):
                host[batch.host_rows, batch.host_slots] = gather_blocks(
                    slot.get(), batch.engine_blocks
                )
        self._done(job_id, moves, start)
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        moves = self._moves(dst_spec, src_spec)
        start = time.perf_counter()
        for batch in moves.batches(self._batch_blocks):
            for slot, host in zip(self._slots, self._host, strict=True):
                rows = host[batch.host_rows, batch.host_slots]  # a copy: the staging
                slot.set(scatter_blocks(slot.get(), batch.engine_blocks, rows))
        self._done(job_id, moves, start)
        return True

    def _done(self, job_id: int, moves: BlockMoves, start: float) -> None:
        self._finished.append(
            TransferResult(
                job_id=job_id,
                success=True,
                transfer_size=len(moves) * self.block_bytes,
                transfer_time=time.perf_counter() - start,
            )
        )

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        """Nothing to wait for: every job finished inside its submit call."""

    def shutdown(self) -> None:
        self._host.clear()  # views of the mapping: released before it is unmapped
        if self._region is not None:
            # The scheduler may already have dropped the file's name (see KvtierCpuSpec).
            if not os.path.exists(self._region.mmap_path):
                current().disown_region(self._region)
            self._region.cleanup()
            self._region = None  # type: ignore[assignment]
