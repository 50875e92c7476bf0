"""``KvtierDiskTier``: vLLM secondary tier over kvtier's verified, bounded ``DiskStore``.

Loaded by vLLM's ``SecondaryTierFactory`` from ``{"type": "KvtierDiskTier",
"module_path": "kvtier.vllm.disk_tier", ...}`` (``kvtier.settings.DiskTierSettings``). The
options are validated and the folder is checked in the constructor, so a bad value or an
unusable folder refuses start-up with the option named; faults while serving (a full disk,
a damaged record) are misses. The tier mechanics (lookups from memory, I/O threads, negative
cache, the opener thread) are ``StoreTier``'s; this adapter only says how to open the store.
Engines sharing a folder see each other's blocks within ``REFRESH_INTERVAL_S``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import Medium

from kvtier.format import HEADER_BYTES, Namespace
from kvtier.log import setup_logging
from kvtier.settings import DiskTierSettings, SharedTierSettings
from kvtier.store import BlockStore, DiskStore, check_root
from kvtier.store.tiered import LocalThenShared
from kvtier.units import format_size
from kvtier.vllm.shared_tier import check_server, open_shared_store, redacted_url
from kvtier.vllm.store_tier import HOUSEKEEPING_INTERVAL_S, NEGATIVE_TTL_S, StoreTier

setup_logging()

#: How often the tier picks up blocks that other engines sharing its folder stored (and
#: their evictions): one indexed SQLite query when nothing changed, off the scheduler thread.
REFRESH_INTERVAL_S = HOUSEKEEPING_INTERVAL_S

StoreFactory = Callable[[DiskTierSettings, Namespace], BlockStore]


def open_disk_store(settings: DiskTierSettings, namespace: Namespace) -> BlockStore:
    """The production store: the folder's ``DiskStore`` for this engine's namespace, in front
    of the shared store when one is configured (``LocalThenShared``)."""
    local = DiskStore(
        settings.root_dir,
        namespace,
        settings.capacity_bytes,
        free_space_floor_bytes=settings.free_space_floor_bytes,
        fsync=settings.fsync,
    )
    if settings.shared is None:
        return local
    try:
        shared = open_shared_store(settings.shared, namespace)
    except BaseException:
        local.close()
        raise
    return LocalThenShared(local, shared)


class KvtierDiskTier(StoreTier):
    """Disk tier: checksummed records, a byte cap, crash-safe writes, persistent index."""

    medium: ClassVar[Medium] = Medium.STORAGE
    label = "disk tier"
    metric_tier = "disk"

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        locality: str | None = None,
        *,
        store_factory: StoreFactory = open_disk_store,
        clock: Callable[[], float] = time.monotonic,
        negative_ttl_s: float = NEGATIVE_TTL_S,
        load_deadline_s: Callable[[int], float] | None = None,
        check_shared: Callable[[SharedTierSettings, int], None] = check_server,
        **options: Any,
    ) -> None:
        self.settings = DiskTierSettings.parse(options)
        check_root(self.settings.root_dir)
        super().__init__(
            offloading_spec,
            primary_kv_view,
            tier_type,
            open_store=lambda namespace: store_factory(self.settings, namespace),
            io_threads=self.settings.io_threads,
            drain_deadline_s=self.settings.drain_deadline_s,
            follow_other_processes=True,
            clock=clock,
            negative_ttl_s=negative_ttl_s,
            load_deadline_s=load_deadline_s,
            locality=locality,
            backpressure_detector=backpressure_detector,
            max_queued_blocks=None if self.settings.shared is None else (
                self.settings.shared.max_queued_blocks
            ),
            start=False,
        )
        if self.settings.shared is not None:
            check_shared(self.settings.shared, self.block_size_bytes)
        self.start()

    def describe(self, store: BlockStore, namespace: Namespace) -> str:
        capacity = int(getattr(store, "capacity_bytes", 0) or 0)
        record = HEADER_BYTES + self.block_size_bytes
        records = capacity // record
        line = (
            f"disk {self.settings.root_dir}: cap {format_size(capacity)} ({capacity:,} B) = "
            f"{records:,} records = {records * self.tokens_per_row:,} tokens, namespace "
            f"{namespace.digest_hex()[:12]}, fsync {self.settings.fsync}"
        )
        if self.settings.shared is not None:
            line += (
                f"; then shared {redacted_url(self.settings.shared.url)} (capacity is the "
                "server's; shared hits written back to disk)"
            )
        return line

