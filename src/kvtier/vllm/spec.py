"""``KvtierCpuSpec``: vLLM's tiering offload spec with a data plane that runs on the CPU backend.

Loaded by vLLM through ``kv_connector_extra_config``::

    {"spec_name": "KvtierCpuSpec", "spec_module_path": "kvtier.vllm.spec", ...}

Everything on the scheduler side (lookup, promotion, cascade to secondary tiers, metrics) is
upstream's ``TieringOffloadingSpec``, unchanged. We replace ``get_worker``, whose upstream
version refuses non-CUDA platforms, make the host-pool region leak-proof
(``kvtier.vllm.host_pool``), and fail closed at start-up: every option of the spec and of
kvtier's tiers is parsed and checked (``kvtier.vllm.engine_context.start_options``, the start
path both of kvtier's specs take) and the disk folder is checked before any pool exists (the
worker's spec is built first), then the guards of ``kvtier.runtime.guards`` run (hash stability,
KV dtypes, KV group kinds, memory, tier sizing). The spec builds its engine's
``EngineContext``, which its tiers share.
"""

import logging
import os
import time
from typing import Any

from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingManager, OffloadingWorker

from kvtier.errors import ConfigError
from kvtier.hostpool.sizing import RowGeometry, check_tiers, enforce
from kvtier.log import setup_logging
from kvtier.runtime.decision_memory import UNMEASURED
from kvtier.runtime.engine_policy import make_policy
from kvtier.runtime.guards import (
    check_group_kinds,
    check_hash_stability,
    check_kv_dtypes,
    persistent_tiers,
    spec_kind,
)
from kvtier.runtime.startup_line import StartupLine
from kvtier.settings import DiskTierSettings
from kvtier.store import effective_capacity
from kvtier.units import format_size
from kvtier.vllm import host_pool
from kvtier.vllm.cpu_worker import CpuOffloadingWorker
from kvtier.vllm.engine_context import EngineContext, KvtierSpec, start_options
from kvtier.vllm.release import current

logger = logging.getLogger(__name__)


class KvtierCpuSpec(KvtierSpec):
    """Tiering spec whose worker copies KV with host memory operations."""

    def __init__(self, config) -> None:  # type: ignore[no-untyped-def]  # vLLM's OffloadingConfig
        setup_logging()  # first: a bad KVTIER_* variable refuses start-up (kvtier.env)
        release = current()
        release.require_cpu_spec()
        options = start_options(config.extra_config, "cpu")
        self.settings = options.host_pool
        self.tier_settings = list(options.tiers)
        super().__init__(config)
        self._cpu_worker: CpuOffloadingWorker | None = None
        #: The engine's shared kvtier state: the restore-or-recompute policy its tiers
        #: register with and decide through, and its start-up line.
        self.kvtier = EngineContext(
            release,
            make_policy(self.settings.restore_decision, time.monotonic),
            keyrings=options.keyrings,
        )
        # KV kinds of each offloaded group, known on the worker side (None: not known).
        self._group_kinds: dict[int, list[str]] | None = None
        # Why the pool was shrunk to fit RAM, if it was (rank 0).
        self._clamp_message: str | None = None
        vllm_config = release.engine_vllm_config(self)  # the worker's spec sees it
        if vllm_config is not None:
            self._check_engine(vllm_config)

    # -- guards that need vLLM's config (worker side) -------------------------------------
    def _check_engine(self, vllm_config: Any) -> None:
        check_hash_stability(
            str(vllm_config.cache_config.prefix_caching_hash_algo),
            os.environ.get("PYTHONHASHSEED"),
            persistent_tiers(self.secondary_tier_configs),
            self.kvtier.release.stable_hash_algos,
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
                    # Fail closed: a layer whose KV kind is unknown could be recurrent state.
                    raise ConfigError(
                        f"kvtier: cannot read the KV cache spec of layer {name} "
                        f"({type(exc).__name__}: {exc}), so kvtier cannot tell whether its "
                        "state is attention KV it may offload. Serve this model without kvtier "
                        "(remove --kv-transfer-config), or report the model to kvtier"
                    ) from exc
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

    # -- sizing guard (worker side) -------------------------------------------------------
    def _num_full_groups(self) -> int:
        if not self._group_kinds:
            return len(self.config.groups)
        full = sum(1 for k in self._group_kinds.values() if set(k) <= {"full", "mla"})
        return full or len(self.config.groups)

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
                f"{self.kv_bytes_per_chunk}; vLLM's pool layout changed, update "
                "kvtier.hostpool.sizing"
            )
        return geometry

    def _check_sizes(self, num_blocks: int) -> None:
        geometry = self._geometry()
        engine = geometry.engine_pool(num_blocks)
        tiers = [geometry.host_pool_rows(self.num_chunks)]
        for tier in self.tier_settings:
            if isinstance(tier, DiskTierSettings):
                capacity = effective_capacity(tier.root_dir, tier.capacity_bytes)
                tiers.append(geometry.disk_tier(capacity))
        logger.info(
            "kvtier sizing: %s",
            "; ".join(
                f"{t.name} {format_size(t.capacity_bytes)} = {t.units:,} x "
                f"{format_size(t.unit_bytes)} = {t.tokens:,} tokens"
                for t in (engine, *tiers)
            ),
        )
        for line in enforce(check_tiers(engine, tiers, geometry), self.settings.allow_small_tiers):
            logger.warning("kvtier: %s", line)

    # -- worker ---------------------------------------------------------------------------
    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._cpu_worker is None:
            rank = 0 if self.replicated_layout else self.config.parallel.rank
            if self.config.parallel.rank == 0:
                host_pool.clean_leftovers(self.settings)
            decision = host_pool.agree_on_rows(
                self.settings,
                self.num_chunks,
                self.kv_bytes_per_chunk,
                self.config.parallel.rank,
                self.config.parallel.world_size,
            )
            self.num_chunks = decision.rows
            # The engine's block count: rows of its KV tensors (exact, on every platform).
            num_blocks = min(int(t.tensor.shape[0]) for t in kv_caches.tensors)
            try:
                self._check_sizes(num_blocks)
            except ConfigError as exc:
                if decision.clamp_message is None:
                    raise
                raise ConfigError(
                    f"{exc}. The pool was shrunk to fit RAM: {decision.clamp_message}"
                ) from None
            region = host_pool.open_worker_region(
                self.settings,
                self.kvtier.release.engine_id(self),
                self.num_chunks,
                rank,
                self.kv_bytes_per_chunk,
                self.cpu_page_size_per_worker,
            )
            try:
                self._cpu_worker = CpuOffloadingWorker(kv_caches, self.blocks_per_chunk, region)
            except Exception:
                region.cleanup()
                raise
        return self._cpu_worker

    # -- scheduler ------------------------------------------------------------------------
    def get_manager(self) -> OffloadingManager:
        release = self.kvtier.release
        first = release.spec_manager(self) is None
        engine_id = release.engine_id(self)
        try:
            if first:
                self.num_chunks = host_pool.adopt_rows(
                    self.settings, engine_id, self.kv_bytes_per_chunk, self.num_chunks
                )
                self._start_line()
                if self.settings.host_pool_dir is not None:
                    manager, region = host_pool.build_file_backed_manager(self, self.settings)
                    release.set_spec_manager(self, manager, region)
            manager = super().get_manager()
        except BaseException:
            if first:
                # The engine will not start: no process will ever map the pool again.
                host_pool.remove_file(self.settings, engine_id)
            raise
        region = release.spec_region(self)
        if first and region is not None:
            host_pool.release_name(region)
        return manager

    def _start_line(self) -> None:
        """Begin the engine's start-up line with the host pool (scheduler side)."""
        geometry = self._geometry()
        pool = geometry.host_pool_rows(self.num_chunks)
        where = self.settings.host_pool_dir or "RAM (/dev/shm)"
        head = (
            f"host pool {format_size(pool.capacity_bytes)} ({pool.capacity_bytes:,} B) = "
            f"{pool.units:,} rows = {pool.tokens:,} tokens in {where}"
        )
        kvtier_tiers = sum(1 for t in self.tier_settings if t is not None)
        others = [
            str(t.get("type"))
            for t, parsed in zip(self.secondary_tier_configs, self.tier_settings, strict=True)
            if parsed is None
        ]
        if others:
            head += f"; other tiers: {', '.join(others)}"
        head += "; restore decision " + ("on" if self.settings.restore_decision else "off")
        decision = UNMEASURED if self.settings.restore_decision else None
        self.kvtier.startup_line = StartupLine(head, kvtier_tiers, decision)
