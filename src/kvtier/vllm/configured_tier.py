"""``ConfiguredTier``: what the disk and shared tiers share between vLLM and ``StoreTier``.

vLLM's ``SecondaryTierFactory`` builds a tier from one entry of ``secondary_tiers``: the
spec, the host pool's view, the tier type, a back-pressure detector, and the entry's other
keys as keyword options. A kvtier tier then, in this order:

1. parses its options into its settings model (``kvtier.settings``): an unknown key or a bad
   value refuses start-up naming the option, before anything is built;
2. checks what it can without the engine (``check_settings``: the disk folder), so a refused
   start-up leaves nothing behind;
3. takes its key ring (``keyring``) from its engine's context: read by kvtier's spec while it
   checked the options, or, under a stock spec, read here (a bad key file refuses start-up).
   Every later use (the tenants' sealers, the store, the server check, the start-up line) is
   handed this ring: the key files are read once per spec, never again by the tier;
4. builds the ``StoreTier`` (threads, decision) with the store factory bound to the settings;
5. checks what needs the host pool's row size (``check``: the shared server, which must take
   one record of that size), still failing closed;
6. starts the opener thread.

Subclasses say which settings model, which store factory and which checks; tests replace the
factory (``store_factory``), the server check (``check``), the clock and the deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Generic, TypeVar

from kvtier.format import Namespace
from kvtier.format.sealing import KeyRing, RecordSealer
from kvtier.log import setup_logging
from kvtier.runtime.tenants import DEFAULT_TENANT
from kvtier.settings import DiskTierSettings, SharedTierSettings
from kvtier.store import BlockStore
from kvtier.units import format_size
from kvtier.vllm.engine_context import engine_context
from kvtier.vllm.release import current
from kvtier.vllm.store_tier import DRAIN_DEADLINE_S, NEGATIVE_TTL_S, StoreTier

SettingsT = TypeVar("SettingsT", DiskTierSettings, SharedTierSettings)

#: Opens the tier's store for an engine's namespace from the tier's settings.
StoreFactory = Callable[[SettingsT, Namespace], BlockStore]
#: Fails closed (raises ``ConfigError``) when the tier cannot work with rows of this size.
StartUpCheck = Callable[[SettingsT, int], None]


class ConfiguredTier(StoreTier, Generic[SettingsT]):
    """A ``StoreTier`` built from its own part of vLLM's options (see the module docstring)."""

    medium: ClassVar[Any] = current().medium.STORAGE
    #: Locality reported to vLLM when the options name none.
    default_locality: ClassVar[str | None] = None
    #: Pick up other processes' stores and evictions every housekeeping interval (a folder
    #: several engines share).
    follow_other_processes: ClassVar[bool] = False

    settings: SettingsT
    #: The tier's master keys (None: a plain tier), read once (see the module docstring).
    keyring: KeyRing | None

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        locality: str | None = None,
        *,
        store_factory: StoreFactory[SettingsT] | None = None,
        check: StartUpCheck[SettingsT] | None = None,
        clock: Callable[[], float] = time.monotonic,
        negative_ttl_s: float = NEGATIVE_TTL_S,
        load_deadline_s: Callable[[int], float] | None = None,
        **options: Any,
    ) -> None:
        setup_logging()  # first: a bad KVTIER_* variable refuses start-up (kvtier.env)
        self.settings = self.parse_settings(options)
        self.check_settings(self.settings)
        context = engine_context(offloading_spec, clock)
        self.keyring = context.keyrings.for_tier(self.settings)
        factory = store_factory if store_factory is not None else self.open_store
        super().__init__(
            offloading_spec,
            primary_kv_view,
            tier_type,
            open_store=lambda namespace: factory(self.settings, namespace),
            io_threads=self.io_threads(self.settings),
            max_queued_blocks=self.max_queued_blocks(self.settings, len(primary_kv_view)),
            follow_other_processes=self.follow_other_processes,
            clock=clock,
            negative_ttl_s=negative_ttl_s,
            load_deadline_s=load_deadline_s,
            locality=locality if locality is not None else self.default_locality,
            backpressure_detector=backpressure_detector,
            start=False,
            drain_deadline_s=self.drain_deadline_s(self.settings),
            require_cache_salt=self.requires_cache_salt(self.settings),
            tenant_sealer=None if self.keyring is None else self.keyring.tenant,
            context=context,
        )
        (check if check is not None else self.check_start_up)(self.settings, self.record_bytes)
        self.start()

    @property
    def server_queue(self) -> str:
        """The start-up line's words for the bound on stores waiting for a server."""
        bound = self._jobs.max_queued_blocks or 0
        held = format_size(bound * self._pool_row_bytes)
        return (
            f"at most {bound:,} blocks ({held} of the host pool) wait for the server, "
            "more are not sent to it (shared_max_queued_blocks)"
        )

    # -- what a subclass says ------------------------------------------------------------
    @classmethod
    def parse_settings(cls, options: Mapping[str, Any]) -> SettingsT:
        """The tier's settings from vLLM's options (raises ``ConfigError``)."""
        raise NotImplementedError(f"{cls.__name__} must say how its options are parsed")

    def open_store(self, settings: SettingsT, namespace: Namespace) -> BlockStore:
        """The production store (the default ``store_factory``), sealed with
        ``store_sealer``."""
        raise NotImplementedError("a ConfiguredTier must say how its store opens")

    def check_settings(self, settings: SettingsT) -> None:
        """Checks that need no engine resources (raise ``ConfigError``); none by default."""

    def check_start_up(self, settings: SettingsT, row_bytes: int) -> None:
        """The default ``check``: none."""

    @staticmethod
    def drain_deadline_s(settings: Any) -> float:
        """How long ``shutdown`` lets transfers go on (see ``kvtier.runtime.jobs``)."""
        return DRAIN_DEADLINE_S

    @staticmethod
    def requires_cache_salt(settings: Any) -> bool:
        """Whether the tier's encryption keeps unsalted requests off it."""
        encryption = getattr(settings, "encryption", None)
        return encryption is not None and bool(encryption.require_cache_salt)

    @property
    def store_sealer(self) -> RecordSealer | None:
        """The sealer the store opens with: the default tenant's of ``keyring`` (a salted
        request's records are reached through its tenant's view: ``kvtier.runtime.tenants``);
        None for a plain tier."""
        return None if self.keyring is None else self.keyring.tenant(DEFAULT_TENANT)

    @staticmethod
    def io_threads(settings: Any) -> int:
        return int(settings.io_threads)

    @staticmethod
    def max_queued_blocks(settings: Any, pool_rows: int) -> int | None:
        """Most store blocks waiting before new stores are dropped, for a host pool of
        ``pool_rows`` rows; None: no bound."""
        return None
