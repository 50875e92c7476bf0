"""``KvtierMlxSpec``: kvtier's spec for an engine whose paged KV cache is MLX arrays.

Loaded by vLLM through ``kv_connector_extra_config`` (``kvtier.mlx.mlx_transfer_config`` builds
it)::

    {"spec_name": "KvtierMlxSpec", "spec_module_path": "kvtier.vllm.mlx_spec",
     "mlx": {"kv_layout": "pages", "staging_bytes": 67108864}, ...}

The scheduler side is the CPU spec's, unchanged: vLLM's tiering spec with kvtier's host pool
index, disk and shared tiers and restore decision. What differs:

* the engine's worker side hands over an MLX cache, not torch tensors (``KvtierMlxConnector``
  calls ``get_mlx_worker``); ``get_worker`` refuses torch tensors;
* the host pool is pageable: a file mapping that is never pre-faulted or pinned
  (``kvtier.vllm.file_region.FileOffloadRegion``), in ``host_pool_dir``, on Linux by default
  in ``/dev/shm/kvtier-mlx`` (RAM); macOS has no such folder, so there it must be given;
* the pool and the copy's staging are fitted into RAM together (``kvtier.mlx.memory_budget``);
* the MLX layout is the KV layout the disk tier's namespace records (``kv_cache_layout``);
* one worker: vllm-metal runs no tensor parallelism, and the MLX worker has no rank slots.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker

from kvtier.errors import ConfigError
from kvtier.mlx.layouts import MlxKVLayout, block_bytes, cache_slots
from kvtier.mlx.memory_budget import decide_pool_rows
from kvtier.mlx.settings import MlxSettings
from kvtier.settings import HostPoolSettings
from kvtier.vllm import host_pool
from kvtier.vllm.mlx_worker import MlxOffloadingWorker
from kvtier.vllm.spec import KvtierCpuSpec

logger = logging.getLogger(__name__)

#: Where the pageable pool's file goes when host_pool_dir is unset (Linux: RAM, tmpfs).
LINUX_POOL_DIR = Path("/dev/shm/kvtier-mlx")


def default_pool_dir(platform: str = sys.platform) -> Path:
    """The pool's folder when ``host_pool_dir`` is unset; ``ConfigError`` where there is none."""
    if platform.startswith("linux"):
        return LINUX_POOL_DIR
    raise ConfigError(
        "kvtier: the MLX data plane keeps its host pool in a file that is never pre-faulted, "
        f"and {platform} has no RAM folder for it by default; set host_pool_dir "
        "(--host-pool-dir) to a folder on the internal disk, such as '~/Library/Caches/kvtier'"
    )


class KvtierMlxSpec(KvtierCpuSpec):
    """Tiering spec whose worker copies between an MLX paged cache and the host pool."""

    def __init__(self, config: Any) -> None:  # vLLM's OffloadingConfig
        self.mlx_settings = MlxSettings.from_extra_config(config.extra_config)
        if config.parallel.world_size != 1:
            raise ConfigError(
                f"kvtier: the MLX data plane runs one worker, but the engine has "
                f"{config.parallel.world_size}; serve it without tensor or pipeline parallelism"
            )
        self.kv_layout = MlxKVLayout(self.mlx_settings.kv_layout)
        # The namespace's KV layout: records of one MLX layout are never read as another's,
        # nor as the CPU backend's.
        config = dataclasses.replace(config, kv_cache_layout=self.kv_layout.namespace_name)
        super().__init__(config)
        if self.settings.host_pool_dir is None:
            self.settings = HostPoolSettings(
                **{**self.settings.model_dump(), "host_pool_dir": default_pool_dir()}
            )
        self._mlx_worker: MlxOffloadingWorker | None = None

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        raise ConfigError(
            "kvtier: KvtierMlxSpec moves MLX arrays, but vLLM registered torch KV tensors; use "
            "kv_connector='KvtierMlxConnector' (kvtier.vllm.mlx_connector) and hand it the MLX "
            "cache, or use KvtierCpuSpec (kvtier.vllm.spec) for a torch cache"
        )

    def get_mlx_worker(self, cache: object) -> MlxOffloadingWorker:
        """The worker over ``cache`` (built once): its arrays checked against the engine's
        block size, the pool clamped to RAM with its staging, the pool's file mapped."""
        if self._mlx_worker is not None:
            return self._mlx_worker
        slots = cache_slots(cache, self.kv_layout)
        cache_block_bytes = sum(block_bytes(slot.get()) for slot in slots)
        if cache_block_bytes != self.config.worker_kv_bytes_per_block:
            raise ConfigError(
                f"kvtier: the MLX cache holds {cache_block_bytes} B a block over "
                f"{len(slots)} arrays, but the engine's KV spec says "
                f"{self.config.worker_kv_bytes_per_block} B; the cache is not the engine's, or "
                f"not in the {self.kv_layout.value!r} layout (MLX option kv_layout)"
            )
        host_pool.clean_leftovers(self.settings)
        self.num_chunks = decide_pool_rows(
            self.num_chunks, self.kv_bytes_per_chunk, self.mlx_settings.staging_bytes
        )
        self._check_sizes(int(slots[0].get().shape[0]))
        region = host_pool.open_worker_region(
            self.settings,
            self.kvtier.release.engine_id(self),
            self.num_chunks,
            0,
            self.kv_bytes_per_chunk,
            self.cpu_page_size_per_worker,
        )
        try:
            self._mlx_worker = MlxOffloadingWorker(
                slots, self.blocks_per_chunk, region, self.mlx_settings.staging_bytes
            )
        except Exception:
            region.cleanup()
            raise
        return self._mlx_worker
