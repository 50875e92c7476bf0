"""``KvtierDiskTier``: vLLM secondary tier over kvtier's verified, bounded ``DiskStore``.

Loaded by vLLM's ``SecondaryTierFactory`` from ``{"type": "KvtierDiskTier",
"module_path": "kvtier.vllm.disk_tier", ...}`` (``kvtier.settings.DiskTierSettings``). The
options are validated and the folder is checked in the constructor, so a bad value or an
unusable folder refuses start-up with the option named; faults while serving (a full disk,
a damaged record) are misses. The tier mechanics (lookups from memory, I/O threads, negative
cache, the opener thread) are ``StoreTier``'s, the wiring from vLLM's options
``ConfiguredTier``'s; this adapter only says how to check the folder and open the store.
Engines sharing a folder see each other's blocks within a housekeeping round
(``kvtier.runtime.opener.HOUSEKEEPING_INTERVAL_S``: one indexed SQLite query when nothing
changed, off the scheduler thread). The tier also
keeps the restore decision's evidence beside its records (``decision.json``), so a fresh
process weighs its first restores with what an earlier one measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kvtier.format import HEADER_BYTES, Namespace
from kvtier.format.sealing import RecordSealer
from kvtier.settings import DiskTierSettings, tier_options
from kvtier.store import BlockStore, DiskStore, RecordIO, check_root
from kvtier.store.disk.layout import DECISION_FILE
from kvtier.store.tiered import LocalThenShared
from kvtier.units import format_size
from kvtier.vllm.configured_tier import ConfiguredTier
from kvtier.vllm.shared_tier import (
    check_server,
    describe_encryption,
    open_shared_store,
    server_queue_bound,
    stored_namespace,
)


def open_disk_store(
    settings: DiskTierSettings,
    namespace: Namespace,
    sealer: RecordSealer | None,
    io: RecordIO | None = None,
) -> BlockStore:
    """The production store: the folder's ``DiskStore`` for this engine's namespace, in front
    of the shared store when one is configured (``LocalThenShared``); both sealed with
    ``sealer`` when the tier is encrypted: its key ring's default tenant's
    (``ConfiguredTier.store_sealer``; the tier reaches a salted request's records through its
    tenant's view: ``kvtier.runtime.tenants``), None for a plain tier.
    ``io``: the folder's file I/O (default: the real one; tests and the soak slow it down)."""
    local = DiskStore(
        settings.root_dir,
        namespace,
        settings.capacity_bytes,
        free_space_floor_bytes=settings.free_space_floor_bytes,
        fsync=settings.fsync,
        sealer=sealer,
        io=io,
    )
    if settings.shared is None:
        return local
    try:
        shared = open_shared_store(settings.shared, namespace, sealer)
    except BaseException:
        local.close()
        raise
    return LocalThenShared(local, shared)


def check_shared_server(settings: DiskTierSettings, row_bytes: int) -> None:
    """With a shared tier behind the disk, fail closed on its server (``check_server``; the
    probe is not sealed: the disk tier's encryption covers the shared tier's records, and the
    shared settings carry none of their own)."""
    if settings.shared is not None:
        check_server(settings.shared, row_bytes, None)


class KvtierDiskTier(ConfiguredTier[DiskTierSettings]):
    """Disk tier: checksummed records, a byte cap, crash-safe writes, persistent index."""

    label = "disk tier"
    metric_tier = "disk"
    follow_other_processes = True
    keeps_decision_evidence = True

    @classmethod
    def parse_settings(cls, options: Mapping[str, Any]) -> DiskTierSettings:
        return DiskTierSettings.parse(tier_options(options))

    check_start_up = staticmethod(check_shared_server)

    def open_store(self, settings: DiskTierSettings, namespace: Namespace) -> BlockStore:
        return open_disk_store(settings, namespace, self.store_sealer)

    def check_settings(self, settings: DiskTierSettings) -> None:
        check_root(settings.root_dir)

    @staticmethod
    def max_queued_blocks(settings: DiskTierSettings, pool_rows: int) -> int | None:
        """Bounded only with a shared tier behind (a slow server must not hold the pool)."""
        return None if settings.shared is None else server_queue_bound(settings.shared, pool_rows)

    @staticmethod
    def drain_deadline_s(settings: DiskTierSettings) -> float:
        return settings.drain_deadline_s

    def decision_evidence_path(self, namespace: Namespace) -> Path:
        """Beside the namespace's records: what it holds was stored by earlier processes of
        this namespace, which measured the evidence (kvtier.runtime.decision_memory)."""
        folder = stored_namespace(self.settings, namespace).digest_hex()
        return Path(self.settings.root_dir) / folder / DECISION_FILE

    def describe(self, store: BlockStore, namespace: Namespace) -> str:
        capacity = store.capacity_bytes
        record = HEADER_BYTES + self.record_bytes
        records = capacity // record
        line = (
            f"disk {self.settings.root_dir}: cap {format_size(capacity)} ({capacity:,} B) = "
            f"{records:,} records = {records * self.tokens_per_row:,} tokens, namespace "
            f"{stored_namespace(self.settings, namespace).digest_hex()[:12]}, "
            f"fsync {self.settings.fsync}"
        )
        line += describe_encryption(self.keyring)
        if self.settings.shared is not None:
            line += (
                f"; then shared {self.settings.shared.url} (capacity is the "
                f"server's; shared hits written back to disk; {self.server_queue})"
            )
        return line
