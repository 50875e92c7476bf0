"""``StoreTier``: a vLLM secondary tier over any kvtier ``BlockStore``.

The tier runs in the scheduler process; vLLM calls every method on the scheduler thread
(under the tiering manager's lock), so each returns at once:

* ``lookup`` answers from the store's in-memory view (``BlockStore.contains``: no syscall);
  while the store is still opening it answers RETRY, so a fresh engine's first request waits
  for the index instead of missing.
* ``submit_store`` queues one task per write thread, each storing its share of the job's
  blocks with ``put_many`` (a disk store reserves and commits a batch in one index
  transaction each); ``submit_load`` one task per read thread, each loading its share with
  one ``get_many_into_when`` (a disk store reads the share in one native call); the rows'
  reads and writes are ``kvtier.runtime.row_io``'s. When more
  than ``max_queued_blocks`` stores are waiting, new stores are dropped and counted (a slow
  tier never holds the host pool); a store with a part that needs no server
  (``BlockStore.without_server``: the disk of a disk tier with a shared tier behind it) still
  writes that part, unbounded as a disk tier alone, and only the server's part is dropped and
  counted (``kvtier:tier_stores_dropped`` under the server part's name).
* A store job for a store this host alone reads (no part on a server) is skipped, finished
  failed with nothing written and counted (``kvtier:tier_stores_skipped``), while no restore
  from the tier could beat the engine's prefill (``kvtier.policy.write_admission``, asked
  through the decider, which tells it of every restore verdict).
* A store that can ask a server about keys it has not seen (``abilities.remote_lookup``: the
  shared tier) answers RETRY for such a key and asks the server on the tier's prober thread,
  all keys of one scheduler step in one batch; vLLM keeps scanning a request's keys on RETRY
  and asks again next step, when the answer is HIT (the store learned the key) or MISS.
* Every load has a deadline, set on its ticket by the restore policy
  (``kvtier.policy.load_tickets``). A load still running at its deadline is
  abandoned: its blocks become misses (recomputed), the tier is marked slow (lookups miss for
  ``SLOW_BACKOFF_S``, doubling while it stays slow), and the late read can never write into
  the row, which vLLM reuses at once (``kvtier.dataplane.abandonable``).
* On an encrypted tier every lookup, store and load goes through the request's tenant's view
  of the store (``kvtier.runtime.tenants.TenantViews``): a salted request's records are named
  and sealed under its own tenant's keys, in the same store, cap and eviction order as every
  other tenant's.
* A load that fails (missing, failed check, I/O error) is a miss: the store drops a bad record
  itself, and the tier keeps the key out of lookups for ``negative_ttl_s`` whatever the cause,
  so no request re-promotes a bad block forever (the livelock of vLLM issue 49176). A good
  store of the key lifts that at once.

The store opens on a thread of its own: its namespace includes the block-hash seed, which vLLM
initialises only after the scheduler (and this tier) exist. Until it is open, lookups answer
RETRY and I/O tasks wait for it on the I/O threads, never on the scheduler thread. A store
that fails to open after the start-up checks passed is a run-time fault: logged as an error,
counted, and every lookup misses.

This class is the adapter between vLLM's ``SecondaryTierManager`` and collaborators that know
nothing of vLLM, one job each (``kvtier.runtime``): ``jobs`` (job table, I/O pools, abandonment),
``opener`` (opener thread, housekeeping), ``prober`` (the server's existence checks),
``health`` (negative cache, deadlines, slow back-off), ``stats`` (counters under one lock) and
``row_io`` (the rows' reads and writes). It translates vLLM's jobs and verdicts and feeds the
restore decision (``kvtier.vllm.tier_decider``); a tier that keeps the decision's evidence in
its folder (``keeps_decision_evidence``: the disk tier) adopts it when its store opens and saves
it from its housekeeping and at shutdown (``kvtier.runtime.decision_memory``).

Seams for tests: ``open_store`` (e.g. a ``MemoryStore``) and ``clock`` (negative-cache expiry,
deadlines).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from vllm.v1.kv_offload.base import (
    LookupResult,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)

from kvtier.format import Namespace
from kvtier.format.sealing import RecordSealer
from kvtier.policy.write_admission import WriteAdmission
from kvtier.runtime.decision_memory import DecisionMemory
from kvtier.runtime.engine_policy import HOST_TIER
from kvtier.runtime.health import NEGATIVE_TTL_S, SLOW_BACKOFF_S, TierHealth
from kvtier.runtime.jobs import DRAIN_DEADLINE_S, FinishedJob, JobTable, StoresQueued
from kvtier.runtime.opener import (
    HOUSEKEEPING_INTERVAL_S,
    OPEN_TIMEOUT_S,
    StoreOpener,
    TierOpener,
)
from kvtier.runtime.prober import ABSENT_TTL_S, ExistenceProber
from kvtier.runtime.row_io import RowIO
from kvtier.runtime.stats import TierCounters, TierStats
from kvtier.runtime.step_clock import STEP_TIMED_NOTE
from kvtier.runtime.tenants import DEFAULT_TENANT, TenantViews, salt_of
from kvtier.store import BlockStore
from kvtier.vllm import metrics
from kvtier.vllm.engine_context import EngineContext, engine_context
from kvtier.vllm.engine_namespace import BlockHashNotReady, build_namespace, engine_row_layout
from kvtier.vllm.release import current
from kvtier.vllm.tier_decider import TierDecider

logger = logging.getLogger(__name__)

__all__ = [
    "ABSENT_TTL_S",
    "DRAIN_DEADLINE_S",
    "HOUSEKEEPING_INTERVAL_S",
    "NEGATIVE_TTL_S",
    "OPEN_TIMEOUT_S",
    "SLOW_BACKOFF_S",
    "StoreOpener",
    "StoreTier",
    "TierCounters",
]


RELEASE = current()


class StoreTier(RELEASE.tier_base):  # type: ignore[misc,valid-type]
    """Secondary tier over a ``BlockStore`` opened once vLLM's block hashes are seeded."""

    #: Log label, e.g. "disk tier".
    label = "tier"
    #: Value of the ``tier`` label of kvtier's metrics, e.g. "disk".
    metric_tier = "store"
    #: Whether the tier can keep the decision's evidence in its folder
    #: (``decision_evidence_path``); the engine's first such tier does.
    keeps_decision_evidence = False

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        *,
        open_store: StoreOpener,
        io_threads: int,
        max_queued_blocks: int | None = None,
        follow_other_processes: bool = False,
        clock: Callable[[], float] = time.monotonic,
        negative_ttl_s: float = NEGATIVE_TTL_S,
        load_deadline_s: Callable[[int], float] | None = None,
        locality: str | None = None,
        backpressure_detector: Any = None,
        start: bool = True,
        drain_deadline_s: float = DRAIN_DEADLINE_S,
        require_cache_salt: bool = False,
        tenant_sealer: Callable[[str | None], RecordSealer] | None = None,
        context: EngineContext | None = None,
    ) -> None:
        """``start=False`` leaves the opener thread to ``start()`` (after more checks).
        ``load_deadline_s(nbytes)``, when given (tests), replaces the policy's deadlines.
        ``drain_deadline_s``: how long ``shutdown`` lets transfers go on.
        ``require_cache_salt``: a request without a salt is never looked up nor stored here.
        ``tenant_sealer``: an encrypted tier's key ring's ``tenant`` (a salt's sealer); the
        store must then be opened with the default tenant's sealer.
        ``context``: the engine's context when the caller already has it (default:
        ``engine_context(offloading_spec, clock)``, a new one under a stock spec)."""
        self._drain_deadline_s = drain_deadline_s
        self._require_cache_salt = require_cache_salt
        self._tenants = TenantViews(tenant_sealer)
        #: The tenant of the latest store job, whose keys the idle tier's probe reads.
        self._recent_salt: str | None = DEFAULT_TENANT
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = RELEASE.locality(locality) if locality is not None else None
        self._clock = clock
        #: The engine's shared kvtier state (kvtier's spec's, or this tier's own).
        self._context: EngineContext = (
            context if context is not None else engine_context(offloading_spec, clock)
        )
        config = RELEASE.offloading_view(offloading_spec)
        #: Stride of the host pool's rows (padding included).
        self._pool_row_bytes = self.block_size_bytes
        replicated = RELEASE.replicated_layout(offloading_spec)
        # Where a worker's part of a row follows its device index, not its TP rank, records
        # cross no TP size (``Release.records_by_heads``).
        self._layout = engine_row_layout(
            config, replicated, self._pool_row_bytes, by_heads=RELEASE.records_by_heads
        )
        self._tp_size = max(int(config.parallel.tp_size), 1)
        #: Tokens of one host-pool row: a chunk of blocks of the first KV group.
        self.tokens_per_row = (config.groups[0].tokens_per_block if config.groups else 0) * max(
            int(config.cache.blocks_per_chunk), 1
        )
        self._stats = TierStats()
        self._health = TierHealth(clock, negative_ttl_s, load_deadline_s)
        self._io = RowIO(
            primary_kv_view,
            self._pool_row_bytes,
            self._layout,
            wait_store=self._wait_store,
            stats=self._stats,
            health=self._health,
            label=self.label,
            tenants=self._tenants,
        )
        #: Payload bytes of one of this tier's records (a row's distinct KV slices).
        self.record_bytes = self._io.record_bytes
        self._prober: ExistenceProber | None = None
        self._reported = metrics.TierSnapshot()
        prefix = f"kvtier-{tier_type.lower()[:6]}"
        self._jobs = JobTable(
            thread_prefix=prefix,
            io_threads=io_threads,
            clock=clock,
            label=self.label,
            stats=self._stats,
            max_queued_blocks=max_queued_blocks,
        )
        self._opener = TierOpener(
            label=self.label,
            thread_name=f"{prefix}-open",
            namespace=lambda: build_namespace(config, self._layout),
            not_ready=BlockHashNotReady,
            open_store=open_store,
            on_open=self._on_open,
            on_failure=self._on_open_failure,
            every_interval=self._housekeeping,
            refresh=follow_other_processes,
        )
        #: The decision's evidence in this tier's folder, once open (the keeper tier only).
        self._memory: DecisionMemory | None = None
        self._keeps_evidence = False
        self.decider = self._make_decider(offloading_spec)
        if start:
            self.start()

    def start(self) -> None:
        """Start opening the store (on its own thread)."""
        self._opener.start()

    def _make_decider(self, spec: Any) -> TierDecider:
        """This tier's part of its engine's restore-or-recompute policy."""
        context = self._context
        observes_prefill = context.claim_prefill_observer(self.metric_tier)
        self._keeps_evidence = self.keeps_decision_evidence and context.claim_evidence_keeper(
            self.metric_tier
        )
        policy = context.policy
        policy.add_tier(self.metric_tier, via=HOST_TIER, writing=self._jobs.writing)
        writes = WriteAdmission(
            policy,
            self.metric_tier,
            context.release.max_model_len(spec),
            self.tokens_per_row,
            self.record_bytes,
            self._clock,
        )
        return TierDecider(
            policy,
            self.metric_tier,
            self.tokens_per_row,
            self.record_bytes,
            self._clock,
            observes_prefill,
            release=context.release,
            max_tokens=context.release.max_prompt_tokens(spec),
            step_clock=context.step_clock if observes_prefill else None,
            writes=writes,
        )

    # -- store lifecycle (opener thread) -------------------------------------------------
    @property
    def store(self) -> BlockStore | None:
        """The open store, or None while it opens (or if it could not be opened)."""
        return self._opener.store

    @property
    def counters(self) -> TierCounters:
        """What this tier did since start-up (a snapshot)."""
        return self._stats.snapshot()

    def _on_open(self, store: BlockStore, namespace: Namespace) -> None:
        if store.abilities.remote_lookup:
            self._prober = ExistenceProber(
                store.exists_many, self._clock, label=self.label, wait_s=HOUSEKEEPING_INTERVAL_S
            )
            self._prober.start()
            if self._opener.stopping:  # shut down while the store opened
                self._prober.stop()
        path = self.decision_evidence_path(namespace) if self._keeps_evidence else None
        if path is not None:
            # Before the store is published: the first lookup already weighs with it.
            device = RELEASE.device_description()
            if device is not None:
                # Engines of other TP sizes may share this namespace (kvtier.runtime.row_layout),
                # and prefill time scales with the ranks: their timings are not this engine's.
                device += f", tensor parallel {self._tp_size}"
                if self._context.step_clock is not None:
                    # Timed to the jobs' arrival instead, prefill reads slow
                    # (kvtier.runtime.step_clock): such timings are not adopted.
                    device += f", {STEP_TIMED_NOTE}"
            memory = DecisionMemory(
                self.decider.policy,
                path,
                namespace.digest_hex(),
                device,
                label=self.label,
            )
            memory.load()
            self._memory = memory
            if self.decider.policy.settings.enabled:
                self._context.report_decision(memory.startup_text)
        self._context.report(self.describe(store, namespace))

    def _on_open_failure(self, exc: BaseException) -> None:
        self._context.report(f"{self.label}: NOT OPEN ({exc})")
        self._stats.open_failed()
        logger.error("kvtier %s: could not be opened, every lookup misses: %s", self.label, exc)

    def describe(self, store: BlockStore, namespace: Namespace) -> str:
        """This tier's part of the engine's start-up line (override to add settings)."""
        return f"{self.label}: namespace {namespace.digest_hex()[:12]}"

    def decision_evidence_path(self, namespace: Namespace) -> Path | None:
        """Where this tier keeps the decision's evidence for ``namespace`` (with
        ``keeps_decision_evidence``); None: nowhere."""
        return None

    def _wait_store(self) -> BlockStore | None:
        """For I/O threads: the store once open, None if it never will be."""
        return self._opener.wait()

    def _housekeeping(self, store: BlockStore) -> None:
        """The opener thread's round, every second: probe an idle tier, save the evidence."""
        self._measure_idle_tier(store)
        if self._memory is not None:
            self._memory.maybe_save()

    def _measure_idle_tier(self, store: BlockStore) -> None:
        """A refused or never-measured tier gets a timed read of one stored record off any
        request's path (the policy says when), so it can show that it recovered. A store
        with nothing to read claims no probe: a fresh tier is measured on its first record,
        not a probe interval later (until then its stores cannot be weighed either)."""
        store = self._tenants.of(store, self._recent_salt)
        key = next(iter(store.keys()), None)
        if key is None or self._opener.stopping:
            return
        if not self.decider.policy.probe_due(self.metric_tier):
            return

        def timed_read() -> None:
            seconds = self._io.timed_read(store, key)
            if seconds is not None:
                self.decider.policy.observe_load(self.metric_tier, self.record_bytes, seconds)

        self._jobs.submit_read(timed_read)

    # -- SecondaryTierManager ------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def _kept_out(self, req_context: Any) -> bool:
        """Whether ``require_cache_salt`` keeps the request off this tier: it has no salt, or
        kvtier's connector did not tag it (fail closed)."""
        if not self._require_cache_salt:
            return False
        tag = RELEASE.request_tenant(req_context)
        return tag is None or not tag.salted

    @staticmethod
    def _salt(req_context: Any) -> str | None:
        """The request's tenant: its salt as kvtier's connector tagged it."""
        return salt_of(RELEASE.request_tenant(req_context))

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        if self._kept_out(req_context):
            return LookupResult.MISS
        self.decider.on_lookup(req_context)
        opened = self.store
        if opened is None:
            return LookupResult.MISS if self._opener.failed else LookupResult.RETRY
        store = self._tenants.of(opened, self._salt(req_context))
        health = self._health
        if health.is_slow():
            return LookupResult.MISS  # overran a deadline recently: recompute instead
        if self._stats.snapshot().loads_stuck >= self._jobs.io_threads:
            return LookupResult.MISS  # every read thread is held by an abandoned load
        if not store.contains(key):
            return self._ask_server(store, key)
        if health.recently_failed(key):
            return LookupResult.MISS
        return self.decider.hit(
            key,
            req_context,
            holds=lambda k: store.contains(k) and not health.recently_failed(k),
            knows_all=not store.abilities.remote_lookup,
        )

    def _ask_server(self, store: BlockStore, key: OffloadKey) -> LookupResult:
        """MISS for a store without a server to ask; else RETRY while the server is asked
        (through ``store``: the request's tenant's view)."""
        prober = self._prober
        if prober is None:
            return LookupResult.MISS
        return LookupResult.RETRY if prober.ask(key, store.exists_many) else LookupResult.MISS

    def on_schedule_end(self, context: Any) -> None:
        self.decider.end_step()

    def submit_store(self, job_metadata: Any) -> None:
        keys = list(job_metadata.keys)
        if self._kept_out(job_metadata.req_context):
            self._jobs.refuse_stores(job_metadata.job_id, keys)
            return
        self.decider.on_store(keys, job_metadata.req_context)
        salt = self._salt(job_metadata.req_context)
        self._recent_salt = salt
        opened = self.store
        store = None if opened is None else self._tenants.of(opened, salt)
        local = None if store is None else store.without_server()
        # Only where this host alone reads the records (no part on a server, whose readers
        # are other machines with a prefill this engine's policy does not know) and no
        # restore from the tier could pay (kvtier.policy.write_admission): the write would
        # only cost the engine. Failed, so vLLM counts it as not stored.
        if store is not None and local is store and not self.decider.writes.admit():
            self._jobs.refuse_stores(job_metadata.job_id, keys)
            self._stats.skipped(len(keys))
            return
        rows = [int(c) for c in RELEASE.job_rows(job_metadata)]
        # Over the bound, a store with a part that needs no server still writes that part.
        keeps_part = local is not None and local is not store
        over_bound = functools.partial(self._io.store_many, local) if keeps_part else None
        queued = self._jobs.submit_stores(
            job_metadata.job_id,
            keys,
            rows,
            functools.partial(self._io.store_share, cache_salt=salt),
            over_bound,
        )
        if queued is StoresQueued.DROPPED:
            # The tier cannot keep up: the store was dropped (a later one may succeed).
            self._stats.dropped(len(keys))
        elif queued is StoresQueued.OVER_BOUND:
            # The server cannot keep up: the local part is written, the server's dropped.
            self._stats.dropped_server_part(len(keys))

    def submit_load(self, job_metadata: Any) -> None:
        """Queue one abandonable read per block, with a deadline for the whole job."""
        keys = list(job_metadata.keys)
        rows = [int(c) for c in RELEASE.job_rows(job_metadata)]
        nbytes = len(keys) * self.record_bytes
        ticket = self.decider.policy.begin_load(self.metric_tier, nbytes)
        self._jobs.submit_loads(
            job_metadata.job_id,
            keys,
            rows,
            functools.partial(self._io.load_share, cache_salt=self._salt(job_metadata.req_context)),
            deadline=lambda: self._health.deadline(nbytes, ticket.deadline_s),
            ticket=ticket,
        )

    def get_finished_jobs(self) -> Iterable[Any]:
        results: list[Any] = []
        for done in self._jobs.finished():
            job = done.job
            if done.abandoned:
                self._overran(done)
            if job.ticket is not None and not job.ticket.abandoned:
                self.decider.policy.end_load(job.ticket)
            ok_keys = [k for k, ok in zip(job.keys, done.outcomes, strict=True) if ok]
            success = len(ok_keys) == len(job.keys)
            results.append(
                RELEASE.job_result(
                    job_id=job.job_id,
                    success=success,
                    successful_keys=None if success or not job.is_load else tuple(ok_keys),
                    transfer_time=done.elapsed_s,
                    transfer_bytes=len(ok_keys) * self.record_bytes,
                )
            )
        return results

    def _overran(self, done: FinishedJob) -> None:
        """A load missed its deadline: count it, skip the tier for a while, miss its keys."""
        self._stats.abandoned(len(done.abandoned))
        if done.job.ticket is not None:
            self.decider.policy.abandon_load(done.job.ticket)
        backoff_s = self._health.overran(done.abandoned)
        logger.warning(
            "kvtier %s: a load of %d block(s) overran its deadline (%.2f s allowed, "
            "abandoned after %.2f s); %d abandoned and recomputed, tier skipped for %.0f s",
            self.label,
            len(done.job.keys),
            done.job.allowed_s,
            done.elapsed_s,
            len(done.abandoned),
            backoff_s,
        )

    def has_pending_work(self) -> bool:
        return self._jobs.has_pending_work()

    def drain_jobs(self) -> None:
        self._jobs.drain()  # waits; never cancels a copy under way

    def shutdown(self) -> None:
        self._opener.stop()
        if self._prober is not None:
            self._prober.stop()
        stuck = self._jobs.shutdown(self._drain_deadline_s)
        if self._memory is not None:
            self._memory.save()  # after the last loads were timed; never raises
        store = self._opener.wait() if self._opener.done else None
        counters = self.counters
        if counters.stores_dropped or counters.server_stores_dropped:
            # Blocks a later process will recompute: the queue bound was reached.
            logger.warning(
                "kvtier %s: %d block store(s) dropped while the tier fell behind, %d stored "
                "without the server's part while the server fell behind (max_queued_blocks)",
                self.label,
                counters.stores_dropped,
                counters.server_stores_dropped,
            )
        if store is not None:
            logger.info("kvtier %s: %s", self.label, store.stats())
            if not stuck:  # closing would wait on the index lock a stuck transfer may hold
                store.close()
        # Our view of the host pool pins its mmap: release it so the pool can be unmapped
        # (a transfer left running still holds a row of it: then the exit unmaps it).
        with contextlib.suppress(BufferError):
            self._io.release()

    # -- metrics -------------------------------------------------------------------------
    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, metrics.OffloadingMetricMetadata]:
        return metrics.metric_definitions()

    def get_stats(self) -> metrics.OffloadingConnectorStats | None:
        """What changed since the last call (scheduler thread: in-memory figures only)."""
        store = self.store
        server_parts: list[str] = []
        if store is None:
            stores = []
        elif store.abilities.parts:
            parts = store.parts()
            stores = [(word, part.stats()) for word, part in parts]
            server_parts = [word for word, part in parts if part.without_server() is None]
        else:
            stores = [(self.metric_tier, store.stats())]
        usage = self._opener.usage
        gauges = (
            {}
            if usage is None
            else {
                metrics.USED_BYTES: float(usage.used_bytes),
                metrics.CAPACITY_BYTES: float(usage.capacity_bytes),
            }
        )
        now = metrics.snapshot(self.metric_tier, stores, self.counters, gauges, server_parts)
        self._add_decision_figures(now)
        delta = metrics.delta_stats(self._reported, now)
        self._reported = now
        return delta

    def _add_decision_figures(self, snap: metrics.TierSnapshot) -> None:
        counts = self.decider.counts
        for verdict in ("restore", "recompute", "unmeasured", "off"):
            snap.counters[(metrics.DECISIONS, (self.metric_tier, verdict))] = getattr(
                counts, verdict
            )
        policy = self.decider.policy.snapshot()
        estimate = policy.tiers.get(self.metric_tier)
        label = (self.metric_tier,)
        if estimate is not None:
            bandwidth = estimate.bandwidth_bytes_per_s
            if bandwidth != float("inf"):
                snap.gauges[(metrics.EST_BANDWIDTH, label)] = bandwidth
            snap.gauges[(metrics.SLOW, label)] = 1.0 if estimate.slow else 0.0
        snap.gauges[(metrics.PREFILL_PER_TOKEN, label)] = self.decider.prefill_per_token_s()
        memory = self._memory
        if memory is not None:
            for outcome in ("loaded", "ignored", "write_failed"):
                snap.counters[(metrics.EVIDENCE_FILES, (self.metric_tier, outcome))] = getattr(
                    memory, outcome
                )
