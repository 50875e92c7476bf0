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

import time
from collections.abc import Callable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import Medium

from kvtier.env import read_env
from kvtier.format import Namespace
from kvtier.log import setup_logging
from kvtier.settings import SharedTierSettings
from kvtier.store import BlockStore
from kvtier.vllm.store_tier import NEGATIVE_TTL_S, StoreTier


def open_shared_store(settings: SharedTierSettings, namespace: Namespace) -> BlockStore:
    """The shared store of this engine's namespace (raises ``ConfigError`` if unusable); the
    password comes from ``KVTIER_SHARED_PASSWORD`` when the settings give none."""
    from kvtier.store.shared import SharedStore  # imports redis-py: only when configured

    return SharedStore(settings.with_password(read_env().shared_password), namespace)


def check_server(settings: SharedTierSettings, row_bytes: int) -> None:
    """Fail closed: connect, authenticate and size-check once; raise ``ConfigError`` if not."""
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
    open_shared_store(settings, probe).close()


class KvtierSharedTier(StoreTier):
    """The shared tier alone (no local disk folder): records on Valkey / Redis."""

    medium: ClassVar[Medium] = Medium.STORAGE
    label = "shared tier"
    metric_tier = "shared"

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        locality: str | None = "REMOTE",
        *,
        store_factory: Callable[[SharedTierSettings, Namespace], BlockStore] = open_shared_store,
        clock: Callable[[], float] = time.monotonic,
        negative_ttl_s: float = NEGATIVE_TTL_S,
        check: Callable[[SharedTierSettings, int], None] = check_server,
        **options: Any,
    ) -> None:
        setup_logging()  # a bad KVTIER_* variable refuses start-up (kvtier.env)
        self.settings = SharedTierSettings.parse(options)
        super().__init__(
            offloading_spec,
            primary_kv_view,
            tier_type,
            open_store=lambda namespace: store_factory(self.settings, namespace),
            io_threads=self.settings.io_threads,
            max_queued_blocks=self.settings.max_queued_blocks,
            clock=clock,
            negative_ttl_s=negative_ttl_s,
            locality=locality,
            backpressure_detector=backpressure_detector,
            start=False,
        )
        check(self.settings, self.block_size_bytes)
        self.start()

    def describe(self, store: BlockStore, namespace: Namespace) -> str:
        return (
            f"shared {self.settings.url}: capacity is the server's (maxmemory), "
            f"namespace {namespace.digest_hex()[:12]}"
        )

