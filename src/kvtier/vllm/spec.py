"""``KvtierCpuSpec``: vLLM's tiering offload spec with a data plane that runs on the CPU backend.

Loaded by vLLM through ``kv_connector_extra_config``::

    {"spec_name": "KvtierCpuSpec", "spec_module_path": "kvtier.vllm.spec", ...}

Everything on the scheduler side (lookup, promotion, cascade to secondary tiers, metrics) is
upstream's ``TieringOffloadingSpec``, unchanged. We replace only ``get_worker``, whose upstream
version refuses non-CUDA platforms, and we make the host-pool region leak-proof.
"""

import contextlib
import logging
import os

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingWorker
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.errors import ConfigError
from kvtier.log import setup_logging
from kvtier.vllm.cpu_worker import CpuOffloadingWorker
from kvtier.vllm.regions import clean_stale_regions

logger = logging.getLogger(__name__)
setup_logging()


class KvtierCpuSpec(TieringOffloadingSpec):
    """Tiering spec whose worker copies KV with host memory operations."""

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]  # vLLM's OffloadingConfig
        if config.canonical_layout:
            raise ConfigError(
                "kvtier: canonical_layout is not supported by the CPU data plane; remove "
                "canonical_layout from kv_connector_extra_config"
            )
        super().__init__(config)
        self._cpu_worker: CpuOffloadingWorker | None = None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._cpu_worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            if self.config.parallel.rank == 0:
                clean_stale_regions()
            region = SharedOffloadRegion(
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                self._cpu_worker = CpuOffloadingWorker(kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise
        return self._cpu_worker

    def get_manager(self) -> OffloadingManager:
        first = self._manager is None
        manager = super().get_manager()
        region = self._scheduler_mmap
        if first and region is not None and not region._creator:
            # vLLM builds the scheduler only after every worker has registered its KV caches,
            # so all workers have mapped the region by now and its name is no longer needed.
            # Dropping it means no exit path, SIGKILL included, can leak the pool in /dev/shm.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(region.mmap_path)
                logger.info(
                    "kvtier: unlinked host pool file %s (all processes mapped it)", region.mmap_path
                )
        return manager
