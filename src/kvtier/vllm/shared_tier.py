"""The shared tier in vLLM: ``KvtierSharedTier``, and the shared half of the disk tier.

Two ways to configure it (``kvtier.kv_transfer_config(shared=URL, ...)`` picks one):

* with a disk folder: one ``KvtierDiskTier`` whose store is ``LocalThenShared`` (local disk
  first, the shared server second, shared hits written back to the disk; why a composite rather
  than two vLLM tiers: ``kvtier.store.tiered``);
* without one: ``KvtierSharedTier``, the shared store alone.

Fail closed at start-up: the tier connects to the server in its constructor (the engine does
not start when the server cannot be reached, refuses the credentials or the TLS handshake),
with a probe namespace (the engine's own is known only once vLLM seeds its block hashes).
Faults while serving (server killed, frozen, restarted empty, a corrupt value) are misses.

The password never appears on the command line when it comes from the environment variable
``KVTIER_SHARED_PASSWORD`` (read here, in the engine's process, by ``kvtier.env``) instead of
the settings. The settings' ``url`` holds no credentials (they are moved out when it is parsed),
so it is printed as it is.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.env import read_env
from kvtier.format import Namespace
from kvtier.format.sealing import KeyRing, RecordSealer, sealed_namespace
from kvtier.runtime.jobs import default_queue_bound
from kvtier.settings import DiskTierSettings, SharedTierSettings, tier_options
from kvtier.store import BlockStore
from kvtier.vllm.configured_tier import ConfiguredTier


def open_shared_store(
    settings: SharedTierSettings, namespace: Namespace, sealer: RecordSealer | None
) -> BlockStore:
    """The shared store of this engine's namespace (raises ``ConfigError`` if unusable); the
    password comes from ``KVTIER_SHARED_PASSWORD`` when the settings give none. ``sealer``:
    behind a disk tier, the disk tier's; else the shared tier's own when it is encrypted
    (``ConfiguredTier.store_sealer``: the default tenant's; a salted request's records are
    reached through its tenant's view, ``kvtier.runtime.tenants``); None: records in the
    clear."""
    from kvtier.store.shared import SharedStore  # imports redis-py: only when configured

    password = read_env().shared_password
    return SharedStore(settings.with_password(password), namespace, sealer=sealer)


def stored_namespace(
    settings: DiskTierSettings | SharedTierSettings, namespace: Namespace
) -> Namespace:
    """The namespace the tier's records are kept under: an encrypted tier's stores mark it
    as sealed (``sealed_namespace``), which gives its folder and its server keys another
    digest; what the tier logs, and where it keeps files beside its records, must follow."""
    return namespace if settings.encryption is None else sealed_namespace(namespace)


def describe_encryption(ring: KeyRing | None) -> str:
    """The start-up line's note on a tier's encryption (``ring``: its keys, None for a plain
    tier): the current key's id (public), never a key."""
    if ring is None:
        return ""
    return (
        f"; encrypted (AES-256-GCM, writes under key {ring.write_key_id.hex()}, "
        f"{len(ring.keys)} key(s) read)"
    )


def server_queue_bound(settings: SharedTierSettings, pool_rows: int) -> int:
    """Most blocks waiting for the server (``shared_max_queued_blocks``, else half the pool's
    ``pool_rows``), for a shared tier alone or behind a disk tier."""
    return settings.max_queued_blocks or default_queue_bound(pool_rows)


def check_server(settings: SharedTierSettings, row_bytes: int, sealer: RecordSealer | None) -> None:
    """Fail closed: connect, authenticate and size-check once, through a store sealed as the
    tier's (``sealer``, as ``open_shared_store``); raise ``ConfigError`` if not."""
    probe = Namespace(
        model="kvtier-start-up-probe",
        weights_fingerprint="",
        kv_dtype="",
        block_size_tokens=0,
        num_groups=0,
        num_layers=0,
        num_kv_heads=0,
        head_size=0,
        block_bytes=row_bytes,
        hash_algorithm="probe",
    )
    open_shared_store(settings, probe, sealer).close()


class KvtierSharedTier(ConfiguredTier[SharedTierSettings]):
    """The shared tier alone (no local disk folder): records on Valkey / Redis."""

    label = "shared tier"
    metric_tier = "shared"
    default_locality = "REMOTE"

    @classmethod
    def parse_settings(cls, options: Mapping[str, Any]) -> SharedTierSettings:
        return SharedTierSettings.parse(tier_options(options))

    def open_store(self, settings: SharedTierSettings, namespace: Namespace) -> BlockStore:
        return open_shared_store(settings, namespace, self.store_sealer)

    def check_start_up(self, settings: SharedTierSettings, row_bytes: int) -> None:
        check_server(settings, row_bytes, self.store_sealer)

    @staticmethod
    def max_queued_blocks(settings: SharedTierSettings, pool_rows: int) -> int | None:
        return server_queue_bound(settings, pool_rows)

    def describe(self, store: BlockStore, namespace: Namespace) -> str:
        return (
            f"shared {self.settings.url}: capacity is the server's (maxmemory), "
            f"namespace {stored_namespace(self.settings, namespace).digest_hex()[:12]}, "
            f"{self.server_queue}"
        ) + describe_encryption(self.keyring)
