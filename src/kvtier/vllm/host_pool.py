"""The host pool's lifecycle: one row count for every process, the region file, its cleanup.

vLLM's scheduler and workers each compute the pool's row count from ``cpu_bytes_to_use``.
kvtier may shrink the pool to fit RAM, a decision that must be taken once: worker rank 0 takes
it (after the engine's KV cache is resident, so nothing is counted twice), shares it with the
other ranks, and creates the region file with that size; the scheduler, built after every
worker, adopts the row count from the file's size (``adopt_rows``).

The region file's name is dropped as soon as every process has mapped it (``release_name``):
then no exit path, SIGKILL included, can leak ``/dev/shm``. Files of dead engines are removed
at start-up (``clean_leftovers``).

Disk-backed pool (``host_pool_dir``): upstream's ``SharedOffloadRegion`` hard-codes
``/dev/shm`` and pre-faults the whole region, and upstream's ``get_manager`` builds one itself.
With a pool folder, workers map a ``FileOffloadRegion`` and ``build_file_backed_manager``
assembles upstream's public pieces (primary tier, secondary tiers from
``SecondaryTierFactory``, ``TieringOffloadingManager``) around one.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm.v1.kv_offload.base import OffloadingManager
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.manager import (
    CPUPrimaryTierOffloadingManager,
    TieringOffloadingManager,
)

from kvtier.errors import ConfigError
from kvtier.hostpool.ram_guard import check_shm_space, clamp_host_pool, read_memory
from kvtier.hostpool.regions import clean_stale_regions, region_path
from kvtier.settings import HostPoolSettings
from kvtier.vllm.file_region import FileOffloadRegion, clean_stale_pool_files, pool_path
from kvtier.vllm.release import current

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RowDecision:
    """The pool's row count and, when it was shrunk to fit RAM, why."""

    rows: int
    clamp_message: str | None = None


def clean_leftovers(settings: HostPoolSettings) -> None:
    """Rank 0, before any region exists: remove region files no live process holds."""
    clean_stale_regions()
    folder = settings.host_pool_dir
    if folder is not None:
        Path(folder).mkdir(mode=0o700, parents=True, exist_ok=True)
        clean_stale_pool_files(str(folder))


def _decide_rows(num_chunks: int, row_bytes: int) -> RowDecision:
    """A RAM pool's row count, clamped to what the machine can spare."""
    clamp = clamp_host_pool(num_chunks * row_bytes, row_bytes, read_memory())
    (logger.warning if clamp.clamped else logger.info)("%s", clamp.message)
    check_shm_space(clamp.pool_bytes)
    return RowDecision(clamp.rows, clamp.message if clamp.clamped else None)


def agree_on_rows(
    settings: HostPoolSettings, num_chunks: int, row_bytes: int, rank: int, world_size: int
) -> RowDecision:
    """The pool's row count, decided once by rank 0 and shared with every rank.

    A refusal on rank 0 (``ConfigError``) is raised on every rank, so no rank starts alone.
    """
    outcome: RowDecision | str
    if rank == 0:
        if settings.host_pool_dir is not None:
            # File-backed: no RAM clamp (its page cache is reclaimable).
            outcome = RowDecision(num_chunks)
        else:
            try:
                outcome = _decide_rows(num_chunks, row_bytes)
            except ConfigError as exc:
                outcome = str(exc)
    else:
        outcome = RowDecision(0)
    if world_size > 1:
        from vllm.distributed.parallel_state import get_world_group

        outcome = get_world_group().broadcast_object(outcome, src=0)
    if isinstance(outcome, str):
        raise ConfigError(outcome)
    return outcome


def open_worker_region(
    settings: HostPoolSettings,
    engine_id: str,
    num_chunks: int,
    rank: int,
    row_bytes: int,
    page_size: int,
) -> SharedOffloadRegion:
    """The worker's mapping of the pool: ``/dev/shm`` (RAM) or a sparse file in a folder."""
    if settings.host_pool_dir is not None:
        return FileOffloadRegion(
            str(settings.host_pool_dir),
            engine_id=engine_id,
            num_chunks=num_chunks,
            rank=rank,
            kv_bytes_per_chunk=row_bytes,
            cpu_page_size=page_size,
        )
    return SharedOffloadRegion(
        **current().region_kwargs(engine_id, num_chunks, rank, row_bytes, page_size)
    )


def pool_file(settings: HostPoolSettings, engine_id: str) -> Path:
    if settings.host_pool_dir is not None:
        return pool_path(str(settings.host_pool_dir), engine_id)
    return region_path(engine_id)


def adopt_rows(settings: HostPoolSettings, engine_id: str, row_bytes: int, configured: int) -> int:
    """Scheduler: the row count the workers chose, read from the size of their region file."""
    try:
        size = pool_file(settings, engine_id).stat().st_size
    except FileNotFoundError:
        return configured
    rows = size // row_bytes
    if rows != configured:
        logger.info(
            "kvtier: scheduler uses the workers' host pool of %d rows (configured %d)",
            rows,
            configured,
        )
    return rows


def build_file_backed_manager(
    spec: Any, settings: HostPoolSettings
) -> tuple[OffloadingManager, FileOffloadRegion]:
    """Upstream's ``TieringOffloadingSpec.get_manager`` around a ``FileOffloadRegion``.

    ``spec`` is the ``TieringOffloadingSpec`` (its public attributes are read). On failure
    everything built so far is shut down before the exception propagates.
    """
    assert settings.host_pool_dir is not None
    region: FileOffloadRegion | None = None
    primary: CPUPrimaryTierOffloadingManager | None = None
    tiers: list[Any] = []
    try:
        region = FileOffloadRegion(
            str(settings.host_pool_dir),
            engine_id=current().engine_id(spec),
            num_chunks=spec.num_chunks,
            rank=None,
            kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
            cpu_page_size=spec.cpu_page_size_per_worker,
        )
        primary = CPUPrimaryTierOffloadingManager(
            num_chunks=spec.num_chunks,
            cache_policy=spec.eviction_policy,
            cache_policy_module_path=spec.cache_policy_module_path,
            enable_events=spec.kv_events_config.enable_kv_cache_events,
            mmap_region=region,
        )
        view = primary.get_kv_memoryview()
        for tier_config in spec.secondary_tier_configs:
            tiers.append(SecondaryTierFactory.create_secondary_tier(tier_config, view, spec))
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
        raise
    logger.info(
        "kvtier: host pool on disk (%s, %d rows) with %d secondary tier(s)",
        region.mmap_path,
        spec.num_chunks,
        len(tiers),
    )
    return manager, region


def release_name(region: SharedOffloadRegion) -> None:
    """Drop the region file's name once every process has mapped it (scheduler side).

    vLLM builds the scheduler only after every worker has registered its KV caches, so all
    workers have mapped the region by now and its name is no longer needed.
    """
    if current().region_creator(region):
        return
    with contextlib.suppress(FileNotFoundError):
        os.unlink(region.mmap_path)
        logger.info("kvtier: unlinked host pool file %s (all mapped it)", region.mmap_path)


def remove_file(settings: HostPoolSettings, engine_id: str) -> None:
    """Remove the region file of an engine whose start-up failed (no process will map it)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(pool_file(settings, engine_id))
