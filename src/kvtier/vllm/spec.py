"""``KvtierCpuSpec``: vLLM's tiering offload spec with a data plane that runs on the CPU backend.

Loaded by vLLM through ``kv_connector_extra_config``::

    {"spec_name": "KvtierCpuSpec", "spec_module_path": "kvtier.vllm.spec", ...}

Everything on the scheduler side (lookup, promotion, cascade to secondary tiers, metrics) is
upstream's ``TieringOffloadingSpec``, unchanged. We replace ``get_worker``, whose upstream
version refuses non-CUDA platforms, make the host-pool region leak-proof, and run kvtier's
start-up guards (``kvtier.vllm.guards``): connector options, hash stability, KV dtypes, KV
group kinds, memory, and tier sizing.

Host pool size. vLLM's scheduler and workers each compute the pool's row count from
``cpu_bytes_to_use``. kvtier may shrink the pool to fit RAM, a decision that must be taken
once: worker rank 0 takes it (after the engine's KV cache is resident, so nothing is counted
twice), shares it with the other ranks, and creates the region file with that size; the
scheduler, built after every worker, adopts the row count from the file's size.

Disk-backed pool (``kvtier_host_pool_dir``). Upstream's ``SharedOffloadRegion`` hard-codes
``/dev/shm`` and pre-faults the whole region, and upstream's ``get_manager`` builds one itself.
With a pool directory set, ``get_worker`` maps a ``FileOffloadRegion`` instead and
``get_manager`` assembles upstream's public pieces around one (the primary tier, the secondary
tiers from ``SecondaryTierFactory``, ``TieringOffloadingManager``); without it, the default path
is upstream's code.
"""

import contextlib
import logging
import os
from pathlib import Path
from typing import Any

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingWorker
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.config import DISK_TIER_TYPE
from kvtier.errors import ConfigError
from kvtier.log import setup_logging
from kvtier.memory import check_shm_space, clamp_host_pool, read_memory
from kvtier.sizing import RowGeometry, check_tiers, enforce
from kvtier.units import format_size, parse_size
from kvtier.vllm.cpu_worker import CpuOffloadingWorker
from kvtier.vllm.file_region import FileOffloadRegion, clean_stale_pool_files, pool_path
from kvtier.vllm.guards import (
    check_connector_options,
    check_group_kinds,
    check_hash_stability,
    check_kv_dtypes,
    parse_options,
    persistent_tiers,
    spec_kind,
)
from kvtier.vllm.regions import clean_stale_regions, region_path

logger = logging.getLogger(__name__)
setup_logging()


def _current_vllm_config() -> Any:
    """vLLM's config when the caller runs inside ``set_current_vllm_config`` (worker), else None."""
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


class KvtierCpuSpec(TieringOffloadingSpec):
    """Tiering spec whose worker copies KV with host memory operations."""

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]  # vLLM's OffloadingConfig
        self.options = parse_options(config.extra_config)
        check_connector_options(config.extra_config)
        super().__init__(config)
        self._cpu_worker: CpuOffloadingWorker | None = None
        # KV kinds of each offloaded group, known on the worker side (None: not known).
        self._group_kinds: dict[int, list[str]] | None = None
        # Why the pool was shrunk to fit RAM, if it was (rank 0).
        self._clamp_message: str | None = None
        vllm_config = _current_vllm_config()
        if vllm_config is not None:
            self._check_engine(vllm_config)

    # -- guards that need vLLM's config (worker side) -------------------------------------
    def _check_engine(self, vllm_config: Any) -> None:
        check_hash_stability(
            str(vllm_config.cache_config.prefix_caching_hash_algo),
            os.environ.get("PYTHONHASHSEED"),
            persistent_tiers(self.secondary_tier_configs),
        )
        layers = vllm_config.compilation_config.static_forward_context
        hma_off = bool(vllm_config.scheduler_config.disable_hybrid_kv_cache_manager)
        dtypes: dict[str, str] = {}
        kinds: dict[int, list[str]] = {}
        for group in self.config.groups:
            for name in group.layer_names:
                layer = layers.get(name)
                if layer is None:
                    continue
                dtype = getattr(layer, "kv_cache_torch_dtype", None)
                if dtype is not None:
                    dtypes[name] = str(dtype).removeprefix("torch.")
                try:
                    kind = spec_kind(layer.get_kv_cache_spec(vllm_config))
                except Exception as exc:
                    logger.warning("kvtier: cannot read the KV spec of %s: %s", name, exc)
                    continue
                if hma_off and kind in ("sliding", "chunked_local"):
                    kind = "full"  # vLLM keeps every token of such layers without HMA
                kinds.setdefault(group.group_id, []).append(kind)
        check_kv_dtypes(dtypes)
        check_group_kinds(kinds)
        self._group_kinds = kinds
        logger.info(
            "kvtier: offloading %d KV group(s): %s",
            len(self.config.groups),
            ", ".join(f"{g}={sorted(set(k))}" for g, k in kinds.items()),
        )

    # -- pool size: memory clamp and sizing guard (worker side) ---------------------------
    def _num_full_groups(self) -> int:
        if not self._group_kinds:
            return len(self.config.groups)
        full = sum(1 for k in self._group_kinds.values() if set(k) <= {"full", "mla"})
        return full or len(self.config.groups)

    def _decide_rows(self) -> int:
        """Rank 0: the row count of a RAM pool, clamped to what the machine can spare."""
        row_bytes = self.kv_bytes_per_chunk
        clamp = clamp_host_pool(self.num_chunks * row_bytes, row_bytes, read_memory())
        (logger.warning if clamp.clamped else logger.info)("%s", clamp.message)
        if clamp.clamped:
            self._clamp_message = clamp.message
        check_shm_space(clamp.pool_bytes)
        return clamp.rows

    def _agree_on_rows(self) -> int:
        """The pool's row count, decided once by rank 0 and shared with every rank."""
        world_size = self.config.parallel.world_size
        outcome: int | str
        if self.config.parallel.rank == 0:
            if self.options.host_pool_dir is not None:
                outcome = self.num_chunks  # file-backed: no RAM clamp (page cache is reclaimable)
            else:
                try:
                    outcome = self._decide_rows()
                except ConfigError as exc:
                    outcome = str(exc)
        else:
            outcome = 0
        if world_size > 1:
            from vllm.distributed.parallel_state import get_world_group

            outcome = get_world_group().broadcast_object(outcome, src=0)
        if isinstance(outcome, str):
            raise ConfigError(outcome)
        return outcome

    def _geometry(self) -> RowGeometry:
        world = 1 if self.replicated_layout else self.config.parallel.world_size
        geometry = RowGeometry(
            block_bytes=self.config.worker_kv_bytes_per_block,
            block_tokens=self.config.groups[0].tokens_per_block,
            blocks_per_chunk=self.blocks_per_chunk,
            world_size=world,
            num_full_groups=self._num_full_groups(),
        )
        if geometry.row_bytes != self.kv_bytes_per_chunk:
            raise RuntimeError(
                f"kvtier: row size {geometry.row_bytes} differs from vLLM's "
                f"{self.kv_bytes_per_chunk}; vLLM's pool layout changed, update kvtier.sizing"
            )
        return geometry

    def _check_sizes(self, num_blocks: int) -> None:
        geometry = self._geometry()
        engine = geometry.engine_pool(num_blocks)
        tiers = [geometry.host_pool_rows(self.num_chunks)]
        for tier in self.secondary_tier_configs:
            if tier.get("type") == DISK_TIER_TYPE and tier.get("capacity_bytes") is not None:
                capacity = parse_size(tier["capacity_bytes"], "disk tier capacity_bytes")
                tiers.append(geometry.disk_tier(capacity))
        logger.info(
            "kvtier sizing: %s",
            "; ".join(
                f"{t.name} {format_size(t.capacity_bytes)} = {t.units:,} x "
                f"{format_size(t.unit_bytes)} = {t.tokens:,} tokens"
                for t in (engine, *tiers)
            ),
        )
        for line in enforce(check_tiers(engine, tiers, geometry), self.options.allow_small_tiers):
            logger.warning("kvtier: %s", line)

    # -- worker ---------------------------------------------------------------------------
    def _open_region(self, rank: int) -> SharedOffloadRegion:
        if self.options.host_pool_dir is not None:
            return FileOffloadRegion(
                self.options.host_pool_dir,
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
        return SharedOffloadRegion(
            engine_id=self._engine_id,
            num_chunks=self.num_chunks,
            rank=rank,
            kv_bytes_per_chunk=self.kv_bytes_per_chunk,
            cpu_page_size=self.cpu_page_size_per_worker,
        )

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._cpu_worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            folder = self.options.host_pool_dir
            if self.config.parallel.rank == 0:
                clean_stale_regions()
                if folder is not None:
                    Path(folder).mkdir(mode=0o700, parents=True, exist_ok=True)
                    clean_stale_pool_files(folder)
            self.num_chunks = self._agree_on_rows()
            # The engine's block count: rows of its KV tensors (exact, on every platform).
            num_blocks = min(int(t.tensor.shape[0]) for t in kv_caches.tensors)
            try:
                self._check_sizes(num_blocks)
            except ConfigError as exc:
                if self._clamp_message is None:
                    raise
                raise ConfigError(
                    f"{exc}. The pool was shrunk to fit RAM: {self._clamp_message}"
                ) from None
            region = self._open_region(rank)
            try:
                self._cpu_worker = CpuOffloadingWorker(kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise
        return self._cpu_worker

    # -- scheduler ------------------------------------------------------------------------
    def _pool_file(self) -> Path:
        if self.options.host_pool_dir is not None:
            return pool_path(self.options.host_pool_dir, self._engine_id)
        return region_path(self._engine_id)

    def _adopt_pool_size(self) -> None:
        """Take the row count the workers chose from the size of the file they created."""
        try:
            size = self._pool_file().stat().st_size
        except FileNotFoundError:
            return
        rows = size // self.kv_bytes_per_chunk
        if rows != self.num_chunks:
            logger.info(
                "kvtier: scheduler uses the workers' host pool of %d rows (configured %d)",
                rows,
                self.num_chunks,
            )
            self.num_chunks = rows

    def _build_file_backed_manager(self) -> OffloadingManager:
        """Upstream's ``TieringOffloadingSpec.get_manager`` around a ``FileOffloadRegion``."""
        assert self.options.host_pool_dir is not None
        region: FileOffloadRegion | None = None
        primary: CPUPrimaryTierOffloadingManager | None = None
        tiers: list[Any] = []
        try:
            region = FileOffloadRegion(
                self.options.host_pool_dir,
                engine_id=self._engine_id,
                num_chunks=self.num_chunks,
                rank=None,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            self._scheduler_mmap = region
            primary = CPUPrimaryTierOffloadingManager(
                num_chunks=self.num_chunks,
                cache_policy=self.eviction_policy,
                cache_policy_module_path=self.cache_policy_module_path,
                enable_events=self.kv_events_config.enable_kv_cache_events,
                mmap_region=region,
            )
            view = primary.get_kv_memoryview()
            for tier_config in self.secondary_tier_configs:
                tiers.append(SecondaryTierFactory.create_secondary_tier(tier_config, view, self))
            manager = TieringOffloadingManager(primary_tier=primary, secondary_tiers=tiers)
        except BaseException:
            for tier in reversed(tiers):
                with contextlib.suppress(Exception):
                    tier.shutdown()
            if primary is not None:
                with contextlib.suppress(Exception):
                    primary.shutdown()
            elif region is not None:
                region.cleanup()
            self._scheduler_mmap = None
            raise
        logger.info(
            "kvtier: host pool on disk (%s, %d rows) with %d secondary tier(s)",
            region.mmap_path,
            self.num_chunks,
            len(tiers),
        )
        return manager

    def get_manager(self) -> OffloadingManager:
        first = self._manager is None
        if first:
            self._adopt_pool_size()
            if self.options.host_pool_dir is not None:
                self._manager = self._build_file_backed_manager()
        manager = super().get_manager()
        region = self._scheduler_mmap
        if first and region is not None and not region._creator:
            # vLLM builds the scheduler only after every worker has registered its KV caches,
            # so all workers have mapped the region by now and its name is no longer needed.
            # Dropping it means no exit path, SIGKILL included, can leak the pool.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(region.mmap_path)
                logger.info(
                    "kvtier: unlinked host pool file %s (all processes mapped it)", region.mmap_path
                )
        return manager
