"""``KvtierDiskTier``: vLLM secondary tier over kvtier's verified, bounded ``DiskStore``.

Loaded by vLLM's ``SecondaryTierFactory`` from ``{"type": "KvtierDiskTier",
"module_path": "kvtier.vllm.disk_tier", ...}``. Runs in the scheduler process; every method is
called on the scheduler thread (under the tiering manager's lock) and returns at once:

* ``lookup`` answers from the store's in-memory index (no syscall); while the store is still
  opening (first use) it answers RETRY, so a fresh engine's first request waits for the index
  instead of missing.
* ``submit_store`` / ``submit_load`` queue one task per block on the tier's own I/O threads
  (background I/O priority), which read/write host-pool rows in place.
* A load that fails (missing file, failed check, I/O error) is a miss: the store quarantines a
  corrupt record and drops it from its index, and the tier also keeps the key out of lookups for
  ``NEGATIVE_TTL_S`` whatever the cause, so no request re-promotes a bad block forever (the
  livelock of vLLM issue 49176).

The store opens on a thread of its own: its namespace includes the block-hash seed, which vLLM
initialises only after the scheduler (and this tier) exist. Until it is open, lookups answer
RETRY and I/O tasks wait for it on the I/O threads, never on the scheduler thread.
"""

import logging
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from kvtier.errors import ConfigError
from kvtier.log import setup_logging
from kvtier.store import DiskStore, set_background_io_priority
from kvtier.threads import name_os_thread
from kvtier.units import parse_size
from kvtier.vllm.namespace import BlockHashNotReady, build_namespace

logger = logging.getLogger(__name__)
setup_logging()

NEGATIVE_TTL_S = 300.0
#: How often the tier picks up blocks that other engines sharing its folder stored (and
#: their evictions): one indexed SQLite query when nothing changed, off the scheduler thread.
REFRESH_INTERVAL_S = 1.0
# How long the opener waits for vLLM to seed its block hashes (done right after start-up).
OPEN_TIMEOUT_S = 600.0


@dataclass
class _Job:
    job_id: int
    is_load: bool
    keys: list[OffloadKey]
    futures: list[Future[bool]]
    submitted: float


class KvtierDiskTier(SecondaryTierManager):
    """Disk tier: checksummed records, a byte cap, crash-safe writes, persistent index."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        root_dir: str,
        capacity_bytes: int | str,
        free_space_floor_bytes: int | str | None = None,
        fsync: str = "never",
        io_threads: int = 4,
        locality: str | None = None,
        backpressure_detector: Any = None,
    ) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if not isinstance(io_threads, int) or io_threads < 1:
            raise ConfigError(f"disk tier: io_threads={io_threads!r}; give a positive integer")
        self.locality = Locality(locality) if locality is not None else None
        self._root = Path(root_dir)
        self._capacity_bytes = parse_size(capacity_bytes, "disk tier capacity_bytes")
        self._floor_bytes = (
            None
            if free_space_floor_bytes is None
            else parse_size(free_space_floor_bytes, "free_space_floor_bytes")
        )
        self._fsync = fsync
        self._spec_config = offloading_spec.config
        self._row_bytes = self.block_size_bytes
        # A 2-D memoryview cannot be indexed by row; a flat byte view can be sliced without copy.
        self._pool_bytes = primary_kv_view.cast("B")
        self._store: DiskStore | None = None
        self._open_error: BaseException | None = None
        self._opened: Future[DiskStore] = Future()
        self._read_pool = ThreadPoolExecutor(
            io_threads, "kvtier-disk-read", initializer=_start_io_thread
        )
        self._write_pool = ThreadPoolExecutor(
            io_threads, "kvtier-disk-write", initializer=_start_io_thread
        )
        self._jobs: dict[int, _Job] = {}
        self._failed_until: dict[OffloadKey, float] = {}
        self._failed_lock = threading.Lock()
        self._stopping = threading.Event()
        threading.Thread(target=self._open_store, name="kvtier-disk-open", daemon=True).start()

    # -- store lifecycle -----------------------------------------------------------------
    def _ready_store(self) -> DiskStore | None:
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
            store = DiskStore(
                self._root,
                namespace,
                self._capacity_bytes,
                free_space_floor_bytes=self._floor_bytes,
                fsync=self._fsync,
            )
        except BaseException as exc:
            logger.error("kvtier disk tier disabled: could not open %s: %s", self._root, exc)
            self._opened.set_exception(exc)
            return
        self._opened.set_result(store)
        self._follow_others(store)

    def _follow_others(self, store: DiskStore) -> None:
        """Apply other processes' stores and evictions until shutdown (this opener thread)."""
        while not self._stopping.wait(REFRESH_INTERVAL_S):
            try:
                store.refresh()
            except Exception:  # never let a refresh problem end the thread silently
                logger.exception("kvtier disk tier: refresh failed")

    def _wait_store(self) -> DiskStore | None:
        """For I/O threads: the store once open, None if it never will be."""
        try:
            return self._opened.result()
        except BaseException:
            return None

    # -- SecondaryTierManager ------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        store = self._ready_store()
        if store is None:
            return LookupResult.MISS if self._open_error is not None else LookupResult.RETRY
        if not store.contains(key):
            return LookupResult.MISS
        if self._failed_until:
            with self._failed_lock:
                until = self._failed_until.get(key)
                if until is not None:
                    if until > time.monotonic():
                        return LookupResult.MISS
                    del self._failed_until[key]
        return LookupResult.HIT

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=True)

    def _submit(self, job: TransferJob, is_load: bool) -> None:
        """Queue one I/O task per block (tasks wait for the store if it is still opening)."""
        keys = list(job.keys)
        rows = [int(c) for c in job.chunk_ids]
        pool, task = (
            (self._read_pool, self._load_one) if is_load else (self._write_pool, self._store_one)
        )
        futures = [pool.submit(task, k, r) for k, r in zip(keys, rows, strict=True)]
        self._jobs[job.job_id] = _Job(job.job_id, is_load, keys, futures, time.perf_counter())

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results: list[JobResult] = []
        for job_id in [j for j, job in self._jobs.items() if all(f.done() for f in job.futures)]:
            job = self._jobs.pop(job_id)
            outcomes = [_succeeded(f) for f in job.futures]
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
        self._stopping.set()
        self.drain_jobs()
        self._read_pool.shutdown(wait=True)
        self._write_pool.shutdown(wait=True)
        store = self._wait_store() if self._opened.done() else None
        if store is not None:
            logger.info("kvtier disk tier: %s", store.stats())
            store.close()

    # -- I/O threads ---------------------------------------------------------------------
    def _row(self, row: int) -> memoryview:
        start = row * self._row_bytes
        return self._pool_bytes[start : start + self._row_bytes]

    def _store_one(self, key: OffloadKey, row: int) -> bool:
        store = self._wait_store()
        if store is None:
            return False
        stored = store.contains(key) or store.put(key, self._row(row))
        if stored and self._failed_until:
            # A fresh good copy is authoritative: the key may be served again.
            with self._failed_lock:
                self._failed_until.pop(key, None)
        return stored

    def _load_one(self, key: OffloadKey, row: int) -> bool:
        store = self._wait_store()
        if store is not None and store.get_into(key, self._row(row)):
            return True
        with self._failed_lock:
            self._failed_until[key] = time.monotonic() + NEGATIVE_TTL_S
        logger.warning(
            "kvtier disk tier: load of block %s failed; it will be recomputed", key.hex()[:16]
        )
        return False


def _start_io_thread() -> None:
    name_os_thread()
    set_background_io_priority()


def _succeeded(future: Future[bool]) -> bool:
    """A task's outcome; an unexpected exception is a failed block, never a crashed engine."""
    try:
        return future.result()
    except Exception:
        logger.exception("kvtier disk tier: I/O task failed")
        return False
