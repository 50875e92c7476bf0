"""A tier's transfer jobs and the I/O threads that run them.

One job is one vLLM transfer (a list of blocks), split between the I/O threads, each taking its
share of the blocks (every n-th). A load's share is one task, read in one native call by a disk
store: one GIL hand-over per share instead of one per block, each of which can wait out the
interpreter's switch interval while the engine's loop runs Python. A store's share is one task
per batch of at most STORE_BATCH_BLOCKS blocks, each written with one ``put_many``: a disk
store reserves and commits the batch in one index transaction each instead of two per block,
the index being most of a put's CPU time (docs/bench/2026-12-07-cpu-write-cost.md). The pools'
threads run at background I/O priority. The table keeps the jobs until they are reported:
``finished`` returns the jobs whose tasks all ended and the load jobs past their deadline whose
unfinished blocks could all be abandoned (``kvtier.dataplane.abandonable``: an abandoned block
never writes its row, which vLLM reuses at once). A block being copied into its row cannot be
abandoned; its job is asked again at the next step (a copy ends within milliseconds).

Stores beyond ``max_queued_blocks`` waiting blocks (a task's blocks count until the task ends)
are dropped (a slow tier never holds the host pool), and reported as failed, unless the job
brings a task for that case (``over_bound``: a disk tier with a shared tier behind it still
writes its disk, as a disk tier alone would, and drops only the server's part). Draining waits
for every task; it never cancels a copy under way. Shutdown waits at most its drain deadline
(``shutdown``).

An abandoned load whose read is still running holds its I/O thread until the read returns;
such reads are counted, one per thread held (``TierStats.stuck``), so the tier can stop
offering hits while every read thread is held.

Called from the scheduler thread (submit, finished, drain, shutdown); the tasks run on the
pools. Knows nothing of vLLM: the tier turns ``FinishedJob`` into vLLM's ``JobResult``.
"""

from __future__ import annotations

import enum
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from kvtier.dataplane.abandonable import AbandonableLoad
from kvtier.runtime.stats import TierStats
from kvtier.store import set_background_io_priority
from kvtier.threads import name_os_thread

logger = logging.getLogger(__name__)

#: How long ``shutdown`` lets queued and running transfers go on (well inside the 30 s
#: grace period orchestrators give); what has not started by then is dropped and counted.
DRAIN_DEADLINE_S = 10.0

#: Most blocks one store task takes (one ``put_many``: a disk store's index transaction pair
#: covers them, ``kvtier.store.disk.schema.PUT_BATCH_MAX``): a long job is several tasks per
#: write thread, so the index is never held long for one job, and shutdown can still drop
#: what has not started.
STORE_BATCH_BLOCKS = 16

#: Share of the host pool's rows that stores waiting on a bounded tier may hold, when its
#: bound is not set (``default_queue_bound``).
QUEUED_POOL_SHARE = 0.5


def default_queue_bound(pool_rows: int) -> int:
    """Most store blocks that may wait on a bounded tier (a server) by default.

    vLLM pins a host-pool row from a store job's submission to its end, so waiting blocks
    are rows the pool can neither evict nor reuse. The bound therefore scales with the pool:
    one count for every model would let a server miss the blocks of a model with large KV
    while most of the pool is free. At most half the pool waits: the other half keeps taking new
    blocks and restores while the server catches up."""
    return max(1, int(pool_rows * QUEUED_POOL_SHARE))


#: A batch of a thread's share of a store: (keys, host-pool rows) -> per block, True when it
#: was stored.
StoreTask = Callable[[list[bytes], list[int]], list[bool]]
#: A thread's share of a load: (keys, host-pool rows, their abandonable loads) -> per block,
#: True when it was loaded.
LoadTask = Callable[[list[bytes], list[int], list[AbandonableLoad]], list[bool]]


class StoresQueued(enum.Enum):
    """What ``submit_stores`` did with a store job."""

    #: The job's store tasks queued.
    WHOLE = "whole"
    #: Over the bound: the job's ``over_bound`` tasks queued instead, unbounded.
    OVER_BOUND = "over_bound"
    #: Over the bound with no ``over_bound`` task: nothing queued, the job reported failed.
    DROPPED = "dropped"


@dataclass
class Job:
    job_id: int
    is_load: bool
    keys: list[bytes]
    futures: list[Future[bool]]
    #: ``time.perf_counter()`` at submission (vLLM's transfer time).
    submitted: float
    #: Loads only: each block's abandonable state, the job's deadline (tier clock), and what
    #: the caller keeps with it (the restore policy's ticket).
    loads: list[AbandonableLoad] | None = None
    deadline: float = float("inf")
    ticket: Any = None
    #: Loads only: seconds the job was allowed when it was queued (its deadline, in words).
    allowed_s: float = float("inf")
    #: The tasks on the I/O pool: one per thread's share of the blocks (a load), one per
    #: batch of a thread's share (a store).
    shares: list[Future[Any]] = field(default_factory=list)


@dataclass(frozen=True)
class FinishedJob:
    """A job ready to report: per block, whether it was transferred."""

    job: Job
    outcomes: list[bool]
    #: Keys of the blocks abandoned at the deadline (empty when the job ended in time).
    abandoned: list[bytes] = field(default_factory=list)
    #: Seconds from submission to now.
    elapsed_s: float = 0.0


class JobTable:
    """The tier's jobs and its read and write pools (see the module docstring)."""

    def __init__(
        self,
        *,
        thread_prefix: str,
        io_threads: int,
        clock: Callable[[], float],
        label: str,
        stats: TierStats | None = None,
        max_queued_blocks: int | None = None,
    ) -> None:
        """``stats``: where stuck loads and shutdown's drops are counted (the tier's)."""
        self._clock = clock
        self._label = label
        self._stats = stats if stats is not None else TierStats()
        self.io_threads = io_threads
        self._max_queued = max_queued_blocks
        self._read_pool = ThreadPoolExecutor(
            io_threads, f"{thread_prefix}-read", initializer=_start_io_thread
        )
        self._write_pool = ThreadPoolExecutor(
            io_threads, f"{thread_prefix}-write", initializer=_start_io_thread
        )
        # Over-bound stores run on threads of their own (started only if one comes): queued
        # behind the bounded stores they would wait on what the bound holds back.
        self._over_bound_pool = ThreadPoolExecutor(
            io_threads, f"{thread_prefix}-write-over", initializer=_start_io_thread
        )
        self._jobs: dict[int, Job] = {}
        #: Blocks of store tasks waiting or running on the bounded write pool
        #: (``max_queued_blocks``).
        self._queued_stores = 0
        #: Blocks of store tasks waiting or running on either write pool (``writing``).
        self._writes = 0
        self._queued_lock = threading.Lock()
        # Every task on the I/O threads not finished yet, with the blocks it transfers: what
        # shutdown waits for, and what it counts as dropped when it cancels the task.
        self._inflight: dict[Future[Any], int] = {}
        self._inflight_lock = threading.Lock()

    @property
    def max_queued_blocks(self) -> int | None:
        """Most store blocks that may wait on the bounded write pool; None: no bound."""
        return self._max_queued

    def _submit(
        self, pool: ThreadPoolExecutor, blocks: int, fn: Callable[..., Any], *args: Any
    ) -> Future[Any]:
        """Submit a task transferring ``blocks`` blocks to an I/O pool, tracked until done
        (for ``shutdown``)."""
        future = pool.submit(fn, *args)
        with self._inflight_lock:
            self._inflight[future] = blocks
        future.add_done_callback(self._task_done)
        return future

    def _task_done(self, future: Future[Any]) -> None:
        with self._inflight_lock:
            self._inflight.pop(future, None)

    def submit_stores(
        self,
        job_id: int,
        keys: Sequence[bytes],
        rows: Sequence[int],
        task: StoreTask,
        over_bound: StoreTask | None = None,
    ) -> StoresQueued:
        """Queue the job's stores: write thread ``t`` of ``n`` takes blocks ``t, t + n, ...``,
        one task (one call of ``task``) per batch of at most STORE_BATCH_BLOCKS. When more
        than ``max_queued_blocks`` blocks would wait, queue ``over_bound`` tasks instead, on
        threads of their own and not counted against the bound (it is for work that does not
        wait on what the bound holds back), or, without one, drop the job: it is then
        reported failed, nothing is written."""
        keys, rows = list(keys), list(rows)
        with self._queued_lock:
            full = self._max_queued is not None and (
                self._queued_stores + len(keys) > self._max_queued
            )
            if not full:
                self._queued_stores += len(keys)
        if not full:
            pool, queued, store = self._write_pool, StoresQueued.WHOLE, task
        elif over_bound is not None:
            pool, queued, store = self._over_bound_pool, StoresQueued.OVER_BOUND, over_bound
        else:
            self.refuse_stores(job_id, keys)
            return StoresQueued.DROPPED
        with self._queued_lock:
            self._writes += len(keys)
        futures: list[Future[bool]] = [Future() for _ in keys]
        run = functools.partial(self._counted_stores, store, not full)
        shares = []
        for picked in _store_batches(len(keys), self.io_threads):
            share = self._submit(pool, len(picked), _share, run, (keys, rows), futures, picked)
            share.add_done_callback(_cancel_blocks_if_cancelled(futures, picked))
            shares.append(share)
        self._jobs[job_id] = Job(job_id, False, keys, futures, time.perf_counter(), shares=shares)
        return queued

    def refuse_stores(self, job_id: int, keys: Sequence[bytes]) -> None:
        """Finish a store job at once, failed, with nothing written or queued."""
        done: Future[bool] = Future()
        done.set_result(False)
        keys = list(keys)
        self._jobs[job_id] = Job(job_id, False, keys, [done] * len(keys), time.perf_counter())

    def _counted_stores(
        self, task: StoreTask, bounded: bool, keys: list[bytes], rows: list[int]
    ) -> list[bool]:
        try:
            return task(keys, rows)
        finally:
            with self._queued_lock:
                self._writes -= len(keys)
                if bounded:
                    self._queued_stores -= len(keys)

    def submit_loads(
        self,
        job_id: int,
        keys: Sequence[bytes],
        rows: Sequence[int],
        task: LoadTask,
        *,
        deadline: Callable[[], float],
        ticket: Any = None,
    ) -> None:
        """Queue one abandonable load per block, in one task per read thread; ``deadline()``
        (tier clock) is asked once the tasks are queued, so the job's time starts when its
        reads may.

        Thread ``t`` of ``n`` takes blocks ``t, t + n, t + 2n, ...``: the threads go through
        the prefix side by side, as one task per block did, so at a deadline the blocks
        loaded are the prefix's front (what a request can use) and a run of slower records
        is shared out rather than left to one thread."""
        keys, rows = list(keys), list(rows)
        loads = [AbandonableLoad() for _ in keys]
        futures: list[Future[bool]] = [Future() for _ in keys]
        threads = min(self.io_threads, len(keys))
        shares = []
        for picked in (range(t, len(keys), threads) for t in range(threads)):
            share = self._submit(
                self._read_pool, len(picked), _share, task, (keys, rows, loads), futures, picked
            )
            share.add_done_callback(_cancel_blocks_if_cancelled(futures, picked))
            shares.append(share)
        deadline_at = deadline()
        self._jobs[job_id] = Job(
            job_id,
            True,
            keys,
            futures,
            time.perf_counter(),
            loads,
            deadline_at,
            ticket,
            allowed_s=deadline_at - self._clock(),
            shares=shares,
        )

    def submit_read(self, task: Callable[[], object]) -> bool:
        """Run ``task`` on a read thread (off any request's path); False once shut down."""
        try:
            self._submit(self._read_pool, 1, task)
        except RuntimeError:  # shut down between the caller's check and the submit
            return False
        return True

    def finished(self) -> list[FinishedJob]:
        """Remove and return the jobs that can be reported now (module docstring)."""
        done: list[FinishedJob] = []
        for job_id, job in list(self._jobs.items()):
            abandoned = self._abandon_if_late(job)
            if abandoned is None:
                continue
            del self._jobs[job_id]
            outcomes = [f.done() and _succeeded(f, self._label) for f in job.futures]
            done.append(FinishedJob(job, outcomes, abandoned, time.perf_counter() - job.submitted))
        return done

    def _abandon_if_late(self, job: Job) -> list[bytes] | None:
        """None: not finished yet. Else the keys abandoned (none if every task ended)."""
        if all(f.done() for f in job.futures):
            return []
        if job.loads is None or self._clock() < job.deadline:
            return None
        pending = [
            (key, load)
            for key, load, f in zip(job.keys, job.loads, job.futures, strict=True)
            if not f.done()
        ]
        if not all(load.abandon() for _, load in pending):
            return None  # a copy is under way; it ends within the next steps
        for share in job.shares:
            if share.running():  # its thread is held until the read returns: count it
                self._stats.stuck(1)
                share.add_done_callback(lambda _: self._stats.stuck(-1))
        return [key for key, _ in pending]

    def has_pending_work(self) -> bool:
        return bool(self._jobs)

    def writing(self) -> bool:
        """Whether stores are queued or being written (a load now shares the device)."""
        with self._queued_lock:
            return self._writes > 0

    def drain(self) -> None:
        """Wait for every task of every job (never cancels a copy under way)."""
        for job in list(self._jobs.values()):
            for future in job.futures:
                future.exception()

    def shutdown(self, drain_deadline_s: float = DRAIN_DEADLINE_S) -> int:
        """Let tasks go on for at most ``drain_deadline_s``, then drop what has not started
        and abandon pending loads, so shutdown never waits on a slow or stalled disk for
        longer than that. Returns the tasks still running (a thread stuck in the kernel cannot
        be stopped); dropped and stuck tasks are counted in the stats.

        Rejected: carrying out every queued store (what ``drain`` does), whose time grows with
        the queue and the disk's speed, past any orchestrator's grace period.
        """
        with self._inflight_lock:
            tasks = dict(self._inflight)  # jobs', abandoned loads' and timed reads' tasks
        futures = list(tasks)
        wait(futures, timeout=drain_deadline_s)
        dropped = sum(blocks for f, blocks in tasks.items() if f.cancel())
        for job in self._jobs.values():
            for load in job.loads or ():
                load.abandon()  # a late read must not write a row vLLM is freeing
        self._read_pool.shutdown(wait=False, cancel_futures=True)
        self._write_pool.shutdown(wait=False, cancel_futures=True)
        self._over_bound_pool.shutdown(wait=False, cancel_futures=True)
        stuck = sum(not f.done() for f in futures)
        self._stats.shut_down(dropped=dropped, stuck=stuck)
        if dropped or stuck:
            logger.warning(
                "kvtier %s: shutdown drained for %.0f s; %d queued transfer(s) dropped, "
                "%d still running left behind",
                self._label,
                drain_deadline_s,
                dropped,
                stuck,
            )
        return stuck


def _store_batches(blocks: int, threads: int) -> list[range]:
    """A store job's tasks: the job is cut into windows of ``threads`` x STORE_BATCH_BLOCKS
    blocks, and a window into as few batches as hold it, at most one a thread: thread ``t`` of
    ``n`` takes blocks ``t, t + n, ...`` of the window (the threads go through the job side by
    side, as one task per block did, so what is written first is a prefix).

    As few batches as hold it, not one a thread: a batch costs a fixed number of GIL hand-overs
    (its index transactions and native calls, ``docs/store.md``, "What a put costs the
    engine") whatever its size, and each takes the GIL from the engine's loop on return, so
    20 blocks written by 4 threads in batches of 5 cost that loop twice the hand-overs of 2
    batches of 10."""
    windows = []
    for start in range(0, blocks, threads * STORE_BATCH_BLOCKS):
        size = min(threads * STORE_BATCH_BLOCKS, blocks - start)
        used = -(-size // STORE_BATCH_BLOCKS)
        windows += [range(start + t, start + size, used) for t in range(used)]
    return windows


def _share(
    task: Callable[..., list[bool]],
    columns: tuple[list[Any], ...],
    futures: list[Future[bool]],
    picked: range,
) -> None:
    """Run ``task`` on the blocks at positions ``picked`` (each of ``columns`` picked there:
    keys, rows, loads) and settle their futures (a raising task fails them all:
    ``_succeeded`` logs it)."""
    for i in picked:
        futures[i].set_running_or_notify_cancel()
    try:
        outcomes = task(*([column[i] for i in picked] for column in columns))
    except BaseException as exc:
        for i in picked:
            futures[i].set_exception(exc)
        raise
    for i, outcome in zip(picked, outcomes, strict=True):
        futures[i].set_result(outcome)


def _cancel_blocks_if_cancelled(
    futures: list[Future[bool]], picked: range
) -> Callable[[Future[Any]], None]:
    """A share's task cancelled before it ran (shutdown): its blocks' futures must end too,
    or waiting for them would never return. Only its own: another share may be starting."""

    def settle(share: Future[Any]) -> None:
        if share.cancelled():
            for i in picked:
                futures[i].cancel()

    return settle


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
