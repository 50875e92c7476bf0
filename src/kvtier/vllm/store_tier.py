"""``StoreTier``: a vLLM secondary tier over any kvtier ``BlockStore``.

The tier runs in the scheduler process; vLLM calls every method on the scheduler thread
(under the tiering manager's lock), so each returns at once:

* ``lookup`` answers from the store's in-memory view (``BlockStore.contains``: no syscall);
  while the store is still opening it answers RETRY, so a fresh engine's first request waits
  for the index instead of missing.
* ``submit_store`` / ``submit_load`` queue one task per block on the tier's own I/O threads,
  which read and write host-pool rows in place. When more than ``max_queued_blocks`` stores
  are waiting, new stores are dropped and counted (a slow tier never holds the host pool).
* A store that can ask a server about keys it has not seen (``exists_many``: the shared
  tier) answers RETRY for such a key and asks the server on the tier's prober thread, all keys
  of one scheduler step in one batch; vLLM keeps scanning a request's keys on RETRY and asks
  again next step, when the answer is HIT (the store learned the key) or MISS.
* Every load has a deadline (``load_deadline_s``). A load still running at its deadline is
  abandoned: its blocks become misses (recomputed), the tier is marked slow (lookups miss for
  ``SLOW_BACKOFF_S``, doubling while it stays slow), and the late read can never write into
  the row, which vLLM reuses at once (``kvtier.dataplane.abandonable``).
* A load that fails (missing, failed check, I/O error) is a miss: the store drops a bad record
  itself, and the tier keeps the key out of lookups for ``negative_ttl_s`` whatever the cause,
  so no request re-promotes a bad block forever (the livelock of vLLM issue 49176). A good
  store of the key lifts that at once.

The store opens on a thread of its own: its namespace includes the block-hash seed, which vLLM
initialises only after the scheduler (and this tier) exist. Until it is open, lookups answer
RETRY and I/O tasks wait for it on the I/O threads, never on the scheduler thread. A store
that fails to open after the start-up checks passed is a run-time fault: logged as an error,
counted, and every lookup misses.

Seams for tests: ``open_store`` (e.g. a ``MemoryStore``) and ``clock`` (negative-cache expiry).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvtier.dataplane.abandonable import (
    AbandonableLoad,
    BounceBuffers,
    LoadState,
    load_abandonably,
)
from kvtier.format import Namespace
from kvtier.store import BlockStore, set_background_io_priority
from kvtier.threads import name_os_thread
from kvtier.vllm import metrics
from kvtier.vllm.decision import TierDecider, make_policy
from kvtier.vllm.namespace import BlockHashNotReady, build_namespace
from kvtier.vllm.startup_line import report_to

logger = logging.getLogger(__name__)

#: How long a key whose load failed stays a miss (unless a good copy is stored first).
NEGATIVE_TTL_S = 300.0
#: How long the opener waits for vLLM to seed its block hashes (done right after start-up).
OPEN_TIMEOUT_S = 600.0
#: How often the opener thread refreshes the store's view and the usage gauges.
HOUSEKEEPING_INTERVAL_S = 1.0
#: How long a key the shared server said it does not hold stays a miss without asking again.
ABSENT_TTL_S = 2.0
#: Deadline of one load job when nothing better is known (the hard ceiling).
LOAD_DEADLINE_S = 30.0
#: How long a tier that overran a deadline is skipped by lookups (doubles, up to 16x).
SLOW_BACKOFF_S = 5.0
#: How long ``shutdown`` lets queued and running transfers go on (well inside the 30 s
#: grace period orchestrators give); what has not started by then is dropped and counted.
DRAIN_DEADLINE_S = 10.0

StoreOpener = Callable[[Namespace], BlockStore]


@dataclass
class TierCounters:
    """What this tier did since start-up (scheduler process); read by metrics and logs."""

    stores_dropped: int = 0
    load_failures: int = 0
    #: Blocks whose load was abandoned at its deadline.
    loads_abandoned: int = 0
    #: Abandoned loads still running in an I/O thread now (a gauge, not a counter).
    loads_stuck: int = 0
    loads: int = 0
    stores: int = 0
    open_failures: int = 0
    #: Blocks whose transfer shutdown dropped (not started by its drain deadline).
    dropped_at_shutdown: int = 0
    #: Transfers still running in an I/O thread when shutdown's drain deadline passed.
    stuck_at_shutdown: int = 0
    #: Seconds spent in store I/O by the tier's threads, per direction.
    read_seconds: float = 0.0
    write_seconds: float = 0.0
    extra: dict[str, int] = field(default_factory=dict)


@dataclass
class _Job:
    job_id: int
    is_load: bool
    keys: list[OffloadKey]
    futures: list[Future[bool]]
    submitted: float
    #: Loads only: each block's abandonable state, and the job's deadline (tier clock).
    loads: list[AbandonableLoad] | None = None
    deadline: float = float("inf")
    ticket: Any = None


class StoreTier(SecondaryTierManager):
    """Secondary tier over a ``BlockStore`` opened once vLLM's block hashes are seeded."""

    #: Log label, e.g. "disk tier".
    label = "tier"
    #: Value of the ``tier`` label of kvtier's metrics, e.g. "disk".
    metric_tier = "store"

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
    ) -> None:
        """``start=False`` leaves the opener thread to ``start()`` (after more checks)."""
        self._drain_deadline_s = drain_deadline_s
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = Locality(locality) if locality is not None else None
        self.counters = TierCounters()
        self._open = open_store
        self._clock = clock
        self._negative_ttl_s = negative_ttl_s
        #: Seconds a load job of N bytes may take before it is abandoned.
        self._load_deadline_s = load_deadline_s or (lambda nbytes: LOAD_DEADLINE_S)
        #: A deadline given by the caller (tests) wins over the policy's.
        self._explicit_deadline = load_deadline_s is not None
        self._slow_until = 0.0
        self._slow_backoff_s = SLOW_BACKOFF_S
        self._max_queued = max_queued_blocks
        self._follow = follow_other_processes
        # Usage gauges, read on the opener thread (a store may need I/O to know them).
        self._gauges: dict[str, float] = {}
        self._reported = metrics.TierSnapshot()
        self._spec = offloading_spec
        self._spec_config = offloading_spec.config
        self._row_bytes = self.block_size_bytes
        config = self._spec_config
        #: Tokens of one host-pool row: a chunk of blocks of the first KV group.
        self.tokens_per_row = (config.groups[0].tokens_per_block if config.groups else 0) * int(
            getattr(config.cache, "blocks_per_chunk", 1) or 1
        )
        # A 2-D memoryview cannot be indexed by row; a flat byte view can be sliced without copy.
        self._pool_bytes = primary_kv_view.cast("B")
        self._bounce = BounceBuffers(self._row_bytes)
        self._store: BlockStore | None = None
        self._open_error: BaseException | None = None
        self._opened: Future[BlockStore] = Future()
        prefix = f"kvtier-{tier_type.lower()[:6]}"
        self._read_pool = ThreadPoolExecutor(
            io_threads, f"{prefix}-read", initializer=_start_io_thread
        )
        self._write_pool = ThreadPoolExecutor(
            io_threads, f"{prefix}-write", initializer=_start_io_thread
        )
        self._jobs: dict[int, _Job] = {}
        # Every task on the I/O threads not finished yet: what shutdown waits for.
        self._inflight: set[Future[Any]] = set()
        self._inflight_lock = threading.Lock()
        self._queued_stores = 0
        self._queued_lock = threading.Lock()
        self._io_threads = io_threads
        self._failed_until: dict[OffloadKey, float] = {}
        self._failed_lock = threading.Lock()
        self._stopping = threading.Event()
        # Keys to ask the server about, keys being asked about, and recent "absent" answers.
        self._probe_lock = threading.Lock()
        self._to_probe: list[OffloadKey] = []
        self._probing: set[OffloadKey] = set()
        self._absent_until: dict[OffloadKey, float] = {}
        self._probe_wanted = threading.Event()
        self._opener = threading.Thread(target=self._open_store, name=f"{prefix}-open", daemon=True)
        self.decider = self._make_decider(offloading_spec)
        if start:
            self.start()

    def start(self) -> None:
        """Start opening the store (on its own thread)."""
        self._opener.start()

    def _make_decider(self, spec: Any) -> TierDecider:
        """This tier's part of the engine's restore-or-recompute policy (the spec's, if it
        keeps one: kvtier's spec does, vLLM's own CPU spec on CUDA does not)."""
        policy = getattr(spec, "restore_policy", None)
        observes_prefill = False
        if policy is None:
            policy = make_policy(True, self._clock)
            observes_prefill = True
        elif getattr(spec, "prefill_observer", None) is None:
            spec.prefill_observer = self.metric_tier  # one tier feeds the prefill model
            observes_prefill = True
        policy.add_tier(self.metric_tier, via="host")
        return TierDecider(
            policy,
            self.metric_tier,
            self.tokens_per_row,
            self._row_bytes,
            self._clock,
            observes_prefill,
        )

    # -- store lifecycle -----------------------------------------------------------------
    @property
    def store(self) -> BlockStore | None:
        """The open store, or None while it opens (or if it could not be opened)."""
        if self._store is None and self._open_error is None and self._opened.done():
            try:
                self._store = self._opened.result()
            except BaseException as exc:
                self._open_error = exc
        return self._store

    def _open_store(self) -> None:
        """Open the store once vLLM has seeded its block hashes (they are in the namespace)."""
        name_os_thread()
        try:
            deadline = time.monotonic() + OPEN_TIMEOUT_S
            while True:
                try:
                    namespace = build_namespace(self._spec_config, self._row_bytes)
                    break
                except BlockHashNotReady:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
            store = self._open(namespace)
        except BaseException as exc:
            report_to(self._spec, f"{self.label}: NOT OPEN ({exc})")
            self.counters.open_failures += 1
            logger.error("kvtier %s: could not be opened, every lookup misses: %s", self.label, exc)
            self._opened.set_exception(exc)
            return
        self._opened.set_result(store)
        report_to(self._spec, self.describe(store, namespace))
        if hasattr(store, "exists_many"):
            threading.Thread(
                target=self._prober, args=(store,), name="kvtier-probe", daemon=True
            ).start()
        self._housekeeping(store)

    def describe(self, store: BlockStore, namespace: Namespace) -> str:
        """This tier's part of the engine's start-up line (override to add settings)."""
        return f"{self.label}: namespace {namespace.digest_hex()[:12]}"

    def _housekeeping(self, store: BlockStore) -> None:
        """Until shutdown (opener thread): pick up other processes' stores and evictions
        (``follow_other_processes``) and refresh the usage gauges."""
        while True:
            try:
                if self._follow:
                    store.refresh()
                self._maybe_probe(store)
                self._gauges = {
                    metrics.USED_BYTES: float(store.used_bytes()),
                    metrics.CAPACITY_BYTES: float(getattr(store, "capacity_bytes", 0) or 0),
                }
            except Exception:  # never let a refresh problem end the thread silently
                logger.exception("kvtier %s: refresh failed", self.label)
            if self._stopping.wait(HOUSEKEEPING_INTERVAL_S):
                return

    def _wait_store(self) -> BlockStore | None:
        """For I/O threads: the store once open, None if it never will be."""
        try:
            return self._opened.result()
        except BaseException:
            return None

    # -- SecondaryTierManager ------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self.decider.on_lookup(req_context)
        store = self.store
        if store is None:
            return LookupResult.MISS if self._open_error is not None else LookupResult.RETRY
        if self._slow_until and self._slow_until > self._clock():
            return LookupResult.MISS  # overran a deadline recently: recompute instead
        if self.counters.loads_stuck >= self._io_threads:
            return LookupResult.MISS  # every read thread is held by an abandoned load
        if not store.contains(key):
            return self._probe(store, key)
        if self._failed_until and self._recently_failed(key):
            return LookupResult.MISS
        return self.decider.hit(
            key,
            req_context,
            holds=lambda k: (
                store.contains(k) and not (self._failed_until and self._recently_failed(k))
            ),
            knows_all=not hasattr(store, "exists_many"),
        )

    def on_schedule_end(self, context: Any) -> None:
        self.decider.end_step()

    def _probe(self, store: BlockStore, key: OffloadKey) -> LookupResult:
        """MISS for a store without a server to ask; else RETRY while the server is asked."""
        if not hasattr(store, "exists_many"):
            return LookupResult.MISS
        with self._probe_lock:
            if key in self._probing:
                return LookupResult.RETRY
            until = self._absent_until.get(key)
            if until is not None:
                if until > self._clock():
                    return LookupResult.MISS
                del self._absent_until[key]
            self._probing.add(key)
            self._to_probe.append(key)
        self._probe_wanted.set()
        return LookupResult.RETRY

    def _prober(self, store: BlockStore) -> None:
        """Ask the server about the keys lookups could not answer (prober thread)."""
        name_os_thread()
        exists_many = store.exists_many  # type: ignore[attr-defined]
        while not self._stopping.is_set():
            if not self._probe_wanted.wait(HOUSEKEEPING_INTERVAL_S):
                continue
            self._probe_wanted.clear()
            with self._probe_lock:
                batch, self._to_probe = self._to_probe, []
            if not batch:
                continue
            try:
                found = exists_many(batch)
            except Exception:  # a store maps faults to "absent"; this is a bug, keep serving
                logger.exception("kvtier %s: existence check failed", self.label)
                found = set()
            until = self._clock() + ABSENT_TTL_S
            with self._probe_lock:
                for key in batch:
                    self._probing.discard(key)
                    if key not in found:
                        self._absent_until[key] = until
                if len(self._absent_until) > 100_000:  # forget stale answers now and then
                    now = self._clock()
                    self._absent_until = {
                        k: t for k, t in self._absent_until.items() if t > now
                    }

    def _recently_failed(self, key: OffloadKey) -> bool:
        with self._failed_lock:
            until = self._failed_until.get(key)
            if until is None:
                return False
            if until > self._clock():
                return True
            del self._failed_until[key]
            return False

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        self.decider.on_store(keys, job_metadata.req_context)
        with self._queued_lock:
            full = self._max_queued is not None and self._queued_stores + len(keys) > (
                self._max_queued
            )
            if not full:
                self._queued_stores += len(keys)
        if full:
            # The tier cannot keep up: drop the store (a later one may succeed), count it.
            self.counters.stores_dropped += len(keys)
            done: Future[bool] = Future()
            done.set_result(False)
            self._jobs[job_metadata.job_id] = _Job(
                job_metadata.job_id, False, keys, [done] * len(keys), time.perf_counter()
            )
            return
        self._submit(job_metadata, keys, is_load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        """Queue one abandonable read per block, with a deadline for the whole job."""
        keys = list(job_metadata.keys)
        rows = [int(c) for c in job_metadata.chunk_ids]
        loads = [AbandonableLoad() for _ in keys]
        futures = [
            self._io(self._read_pool, self._load_one, k, r, load)
            for k, r, load in zip(keys, rows, loads, strict=True)
        ]
        nbytes = len(keys) * self._row_bytes
        ticket = self.decider.policy.begin_load(self.metric_tier, nbytes)
        allowed = (
            self._load_deadline_s(nbytes)
            if self._explicit_deadline
            else self.decider.load_deadline_s(ticket.deadline_s)
        )
        self._jobs[job_metadata.job_id] = _Job(
            job_metadata.job_id,
            True,
            keys,
            futures,
            time.perf_counter(),
            loads,
            self._clock() + allowed,
            ticket,
        )

    def _submit(self, job: TransferJob, keys: list[OffloadKey], is_load: bool) -> None:
        """Queue one store task per block (tasks wait for the store if it is still opening)."""
        rows = [int(c) for c in job.chunk_ids]
        futures = [
            self._io(self._write_pool, self._store_one, k, r)
            for k, r in zip(keys, rows, strict=True)
        ]
        self._jobs[job.job_id] = _Job(job.job_id, is_load, keys, futures, time.perf_counter())

    def _io(self, pool: ThreadPoolExecutor, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Submit a task to an I/O pool, tracked until done (for ``shutdown``)."""
        future = pool.submit(fn, *args)
        with self._inflight_lock:
            self._inflight.add(future)
        future.add_done_callback(self._task_done)
        return future

    def _task_done(self, future: Future[Any]) -> None:
        with self._inflight_lock:
            self._inflight.discard(future)

    def _finished(self, job: _Job) -> bool:
        """Done, or a load past its deadline whose unfinished blocks are now abandoned."""
        if all(f.done() for f in job.futures):
            return True
        if job.loads is None or self._clock() < job.deadline:
            return False
        pending = [
            load for load, f in zip(job.loads, job.futures, strict=True) if not f.done()
        ]
        if not all(load.abandon() for load in pending):
            return False  # a copy is under way; it ends within the next steps
        self._overran(job, len(pending))
        return True

    def _overran(self, job: _Job, abandoned: int) -> None:
        """A load missed its deadline: count it, skip the tier for a while, miss its keys."""
        now = self._clock()
        self.counters.loads_abandoned += abandoned
        if job.ticket is not None:
            self.decider.policy.abandon_load(job.ticket)
        self._slow_until = now + self._slow_backoff_s
        logger.warning(
            "kvtier %s: a load of %d block(s) overran its deadline; %d abandoned and "
            "recomputed, tier skipped for %.0f s",
            self.label,
            len(job.keys),
            abandoned,
            self._slow_backoff_s,
        )
        self._slow_backoff_s = min(self._slow_backoff_s * 2, SLOW_BACKOFF_S * 16)
        with self._failed_lock:
            for key, future in zip(job.keys, job.futures, strict=True):
                if not future.done():
                    self._failed_until[key] = now + self._negative_ttl_s
        for future in job.futures:
            if future.running():  # its thread is held until the read returns: count it
                with self._queued_lock:
                    self.counters.loads_stuck += 1
                future.add_done_callback(self._unstuck)

    def _unstuck(self, future: Future[bool]) -> None:
        with self._queued_lock:
            self.counters.loads_stuck -= 1

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results: list[JobResult] = []
        for job_id in [j for j, job in self._jobs.items() if self._finished(job)]:
            job = self._jobs.pop(job_id)
            if job.ticket is not None and not job.ticket.abandoned:
                self.decider.policy.end_load(job.ticket)
            outcomes = [f.done() and _succeeded(f, self.label) for f in job.futures]
            ok_keys = [k for k, ok in zip(job.keys, outcomes, strict=True) if ok]
            success = len(ok_keys) == len(job.keys)
            results.append(
                JobResult(
                    job_id=job_id,
                    success=success,
                    successful_keys=None if success or not job.is_load else tuple(ok_keys),
                    transfer_time=time.perf_counter() - job.submitted,
                    transfer_bytes=len(ok_keys) * self._row_bytes,
                )
            )
        return results

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def drain_jobs(self) -> None:
        for job in list(self._jobs.values()):
            for future in job.futures:
                future.exception()  # waits; never cancels a copy under way

    def shutdown(self) -> None:
        """Let transfers go on for at most the drain deadline, then drop what has not
        started (counted in ``dropped_at_shutdown``) and abandon pending loads, so shutdown
        never waits on a slow or stalled disk for longer than that.

        Rejected: carrying out every queued store (what ``drain_jobs`` does), whose time
        grows with the queue and the disk's speed, past any orchestrator's grace period.
        A transfer still running at the deadline (a thread stuck in the kernel) cannot be
        stopped: it is counted in ``stuck_at_shutdown`` and the store is left open for it
        (closing would wait on the index lock it may hold).
        """
        self._stopping.set()
        self._probe_wanted.set()
        with self._inflight_lock:
            futures = list(self._inflight)  # jobs', abandoned loads' and probes' tasks
        wait(futures, timeout=self._drain_deadline_s)
        dropped = sum(f.cancel() for f in futures)
        for job in self._jobs.values():
            for load in job.loads or ():
                load.abandon()  # a late read must not write a row vLLM is freeing
        self._read_pool.shutdown(wait=False, cancel_futures=True)
        self._write_pool.shutdown(wait=False, cancel_futures=True)
        stuck = sum(not f.done() for f in futures)
        self.counters.dropped_at_shutdown += dropped
        self.counters.stuck_at_shutdown += stuck
        if dropped or stuck:
            logger.warning(
                "kvtier %s: shutdown drained for %.0f s; %d queued transfer(s) dropped, "
                "%d still running left behind",
                self.label,
                self._drain_deadline_s,
                dropped,
                stuck,
            )
        store = self._wait_store() if self._opened.done() else None
        if store is not None:
            logger.info("kvtier %s: %s", self.label, store.stats())
            if not stuck:
                store.close()
        # Our view of the host pool pins its mmap: release it so the pool can be unmapped
        # (a transfer left running still holds a row of it: then the exit unmaps it).
        with contextlib.suppress(BufferError):
            self._pool_bytes.release()

    def _maybe_probe(self, store: BlockStore) -> None:
        """A refused or never-measured tier gets a timed read of one stored record off any
        request's path (the policy says when), so it can show that it recovered."""
        if not self.decider.policy.probe_due(self.metric_tier):
            return
        key = next(iter(store.keys()), None)
        if key is None:
            return

        def probe() -> None:
            started = time.perf_counter()
            if store.get_into(key, self._bounce.get()):
                seconds = time.perf_counter() - started
                self.decider.policy.observe_load(self.metric_tier, self._row_bytes, seconds)

        if self._stopping.is_set():
            return
        try:
            self._io(self._read_pool, probe)
        except RuntimeError:  # shut down between the check and the submit
            return

    # -- metrics -------------------------------------------------------------------------
    @classmethod
    def build_metric_definitions(
        cls, extra_config: dict[str, Any]
    ) -> dict[str, metrics.OffloadingMetricMetadata]:
        return metrics.metric_definitions()

    def get_stats(self) -> metrics.OffloadingConnectorStats | None:
        """What changed since the last call (scheduler thread: in-memory figures only)."""
        store = self.store
        parts = getattr(store, "parts", None)
        stores = (
            [(word, part.stats()) for word, part in parts()]
            if parts is not None
            else [(self.metric_tier, store.stats())]
            if store is not None
            else []
        )
        now = metrics.snapshot(self.metric_tier, stores, self.counters, self._gauges)
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

    # -- I/O threads ---------------------------------------------------------------------
    def _row(self, row: int) -> memoryview:
        # A slice past the pool's end is short or empty, and a negative row counts from the
        # end: either would store a record of the wrong length (or another row's bytes).
        if not 0 <= row < self._pool_bytes.nbytes // self._row_bytes:
            raise IndexError(f"host-pool row {row} outside the pool's rows")
        start = row * self._row_bytes
        return self._pool_bytes[start : start + self._row_bytes]

    def _store_one(self, key: OffloadKey, row: int) -> bool:
        try:
            store = self._wait_store()
            if store is None:
                return False
            started = time.perf_counter()
            row_view = self._row(row)
            # A record of another length can never load into a row: replace it.
            stored = store.payload_len(key) == self._row_bytes or store.put(key, row_view)
            self.counters.write_seconds += time.perf_counter() - started
            if stored:
                self.counters.stores += 1
                if self._failed_until:
                    # A fresh good copy is authoritative: the key may be served again.
                    with self._failed_lock:
                        self._failed_until.pop(key, None)
            return stored
        finally:
            with self._queued_lock:
                self._queued_stores -= 1

    def _read(self, store: BlockStore, key: OffloadKey, row: int, load: AbandonableLoad) -> bool:
        """One verified block into its row, never after the load was abandoned.

        Stores that wait before they write (``get_into_when``: the shared store) fill the row
        once claimed; others read into this thread's bounce buffer first (a disk read writes
        while it waits).
        """
        get_when = getattr(store, "get_into_when", None)
        if get_when is None:
            return load_abandonably(
                load, lambda out: store.get_into(key, out), self._bounce.get(), self._row(row)
            )
        try:
            return bool(get_when(key, self._row(row), load.claim, self._bounce.get()))
        finally:
            if load.state is LoadState.COPYING:
                load.finish()

    def _load_one(self, key: OffloadKey, row: int, load: AbandonableLoad) -> bool:
        store = self._wait_store()
        started = time.perf_counter()
        if store is not None and self._read(store, key, row, load):
            self.counters.read_seconds += time.perf_counter() - started
            self.counters.loads += 1
            if self._slow_until:
                self._slow_backoff_s = SLOW_BACKOFF_S  # loads complete again
            return True
        if load.state is LoadState.ABANDONED:
            return False  # counted when it was abandoned
        if store is not None and store.payload_len(key) not in (None, self._row_bytes):
            store.delete(key)  # it can never load: drop it so lookups stop offering it
        self.counters.load_failures += 1
        with self._failed_lock:
            self._failed_until[key] = self._clock() + self._negative_ttl_s
        logger.warning(
            "kvtier %s: load of block %s failed; it will be recomputed", self.label, key.hex()[:16]
        )
        return False


def _start_io_thread() -> None:
    name_os_thread()
    set_background_io_priority()


def _succeeded(future: Future[bool], label: str) -> bool:
    """A task's outcome; an unexpected exception is a failed block, never a crashed engine."""
    try:
        return future.result()
    except Exception:
        logger.exception("kvtier %s: I/O task failed", label)
        return False
