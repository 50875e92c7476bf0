"""The CPU data plane: moves KV blocks between vLLM's CPU KV cache and the host pool.

Upstream's ``CPUOffloadingWorker`` drives CUDA/XPU DMA streams and refuses any other platform.
This worker implements the same ``OffloadingWorker`` contract for the CPU backend: the byte
placement comes from :mod:`kvtier.dataplane.host_layout` (upstream's layout, pinned by tests), the
copies run on :class:`kvtier.dataplane.copy_engine.CopyEngine` threads.
"""

import logging

import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from kvtier.dataplane.copy_engine import CopyEngine
from kvtier.dataplane.host_layout import CopyPlan, CopyRef, TensorPlacement, plan_copies
from kvtier.vllm.release import current

logger = logging.getLogger(__name__)


class CpuOffloadingWorker(OffloadingWorker):
    """``OffloadingWorker`` for engine KV tensors that live in host memory.

    Contract (from vLLM's connector): ``submit_store``/``submit_load`` return at once and the
    copy runs in the background; each finished job is reported exactly once by
    ``get_finished``; ``wait`` blocks until the listed jobs are done; transfers of one direction
    complete in submission order. Owns ``region`` and releases it in ``shutdown``.
    """

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        region: SharedOffloadRegion,
    ) -> None:
        self._region = region
        self._blocks_per_chunk = blocks_per_chunk
        # Keep the views alive: the plans hold raw addresses into them.
        self._engine_views: list[torch.Tensor] = []
        self._host_views: list[torch.Tensor] = []
        placements: list[TensorPlacement] = []
        for canonical in kv_caches.tensors:
            engine = canonical.tensor
            if engine.device.type != "cpu" or engine.dtype != torch.int8 or engine.ndim != 2:
                raise RuntimeError(
                    "kvtier CPU worker expects int8 (num_blocks, page) KV tensors on the CPU, got "
                    f"{engine.dtype} {tuple(engine.shape)} on {engine.device}"
                )
            page = canonical.page_size_bytes
            host = region.create_next_worker_view(page * blocks_per_chunk)
            self._engine_views.append(engine)
            self._host_views.append(host)
            placements.append(
                TensorPlacement(
                    engine_base=engine.data_ptr(),
                    engine_stride=engine.stride(0),
                    host_base=host.data_ptr(),
                    host_stride=host.stride(0),
                    page_bytes=page,
                )
            )
        self._placements = tuple(placements)
        self._group_refs = tuple(
            tuple(CopyRef(ref.tensor_idx, ref.page_size_bytes) for ref in refs)
            for refs in kv_caches.group_data_refs
        )
        self._engine = CopyEngine()
        logger.info(
            "kvtier CPU worker: %d KV tensors, %d KV groups, %d blocks per chunk, %d host chunks",
            len(placements),
            len(self._group_refs),
            blocks_per_chunk,
            region.num_chunks,
        )

    def plan(
        self, engine_spec: GPULoadStoreSpec, host_spec: LoadStoreSpec, to_host: bool
    ) -> CopyPlan:
        """Copy plan of one transfer (exposed for tests)."""
        if not isinstance(host_spec, BlockIDsLoadStoreSpec):
            raise TypeError(f"host-side spec must carry chunk ids, got {type(host_spec).__name__}")
        return plan_copies(
            self._placements,
            self._group_refs,
            self._blocks_per_chunk,
            engine_spec.block_ids,
            engine_spec.group_sizes,
            engine_spec.block_indices,
            host_spec.block_ids,
            to_host=to_host,
        )

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        self._engine.submit_store(job_id, self.plan(src_spec, dst_spec, to_host=True))
        return True

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        self._engine.submit_load(job_id, self.plan(dst_spec, src_spec, to_host=False))
        return True

    def get_finished(self) -> list[TransferResult]:
        results = []
        for job in self._engine.take_finished():
            if job.error is not None:
                # The connector asserts success, and a half-copied block must not be served:
                # stop loudly rather than hand the engine wrong KV.
                raise RuntimeError(f"kvtier: KV copy job {job.job_id} failed") from job.error
            results.append(
                TransferResult(
                    job_id=job.job_id,
                    success=True,
                    transfer_size=job.plan.total_bytes,
                    transfer_time=job.elapsed_s,
                )
            )
        return results

    def wait(self, job_ids: set[int]) -> None:
        self._engine.wait(job_ids)

    def shutdown(self) -> None:
        self._engine.close()
        self._engine_views.clear()
        self._host_views.clear()
        if self._region is not None:
            # The scheduler may already have dropped the file's name (see KvtierCpuSpec).
            if not self._region_path_exists():
                current().disown_region(self._region)
            self._region.cleanup()
            self._region = None  # type: ignore[assignment]

    def _region_path_exists(self) -> bool:
        import os

        return os.path.exists(self._region.mmap_path)
