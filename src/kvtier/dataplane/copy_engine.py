"""Background memory copies for the CPU data plane.

vLLM's CUDA worker hands copies to DMA streams; on the CPU backend the engine's KV cache and the
host pool are both ordinary memory, so a copy is a ``memmove``. Running the copies on our own
threads keeps them off the engine's step thread: ``ctypes.memmove`` releases the GIL, so the
model's forward pass and a long restore overlap.

Two queues, one per direction, each executed in submission order (upstream's ordering contract:
transfers of one direction are serialised). Loads get their own thread so a burst of stores
never delays a restore, which is on the time-to-first-token path.

Copies run in one native call per plan with streaming stores (kvtier.native, compiled when
kvtier is installed): glibc copies ~200 KB pages with ordinary stores, which reached only half of
one large memcpy here. Without it, one ``ctypes.memmove`` per page. A large load is also split
over the process's CPUs, since a request being restored waits for every byte. Stores are not
split: they run while the engine computes, and extra copy threads would take its cores.
"""

import ctypes
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from kvtier.dataplane.host_layout import CopyPlan
from kvtier.native import page_copier
from kvtier.threads import name_os_thread, usable_cpus

logger = logging.getLogger(__name__)


@dataclass
class CopyJob:
    """One transfer: a copy plan plus its completion state."""

    job_id: int
    plan: CopyPlan
    done: threading.Event = field(default_factory=threading.Event)
    elapsed_s: float = 0.0
    error: BaseException | None = None


#: A plan smaller than this runs on one thread: below it, handing out parts costs more than
#: a second core saves.
SPLIT_MIN_BYTES = 16 << 20
#: Most threads one load is split over (memory bandwidth, not cores, is the limit beyond).
MAX_SPLIT = 4


def run_plan(plan: CopyPlan, helpers: ThreadPoolExecutor | None = None, parts: int = 1) -> None:
    """Execute every copy of ``plan`` (blocking; the GIL is released while copying).

    With ``helpers`` and ``parts`` > 1, a plan of at least ``SPLIT_MIN_BYTES`` is cut into
    ``parts`` runs of consecutive copies: ``parts - 1`` run on ``helpers``, one on the calling
    thread. The copies of one plan never overlap, so their order does not matter; the call
    returns when all are done and re-raises the first error.
    """
    n = len(plan.sizes)
    if len(plan.src) != n or len(plan.dst) != n:
        raise ValueError(f"copy plan of {n} sizes, {len(plan.src)} sources, {len(plan.dst)} dests")
    dst, src, sizes = (
        np.ascontiguousarray(a, dtype=np.uint64) for a in (plan.dst, plan.src, plan.sizes)
    )
    arrays = (dst, src, sizes)
    if helpers is None or parts <= 1 or plan.total_bytes < SPLIT_MIN_BYTES:
        copy_range(arrays, 0, n)
        return
    bounds = [n * i // parts for i in range(parts + 1)]
    futures = [helpers.submit(copy_range, arrays, a, b) for a, b in itertools.pairwise(bounds[1:])]
    try:
        copy_range(arrays, 0, bounds[1])
    finally:
        errors = [f.exception() for f in futures]  # waits for every part
    if first := next((e for e in errors if e is not None), None):
        raise first


def copy_range(arrays: tuple[np.ndarray, np.ndarray, np.ndarray], start: int, stop: int) -> None:
    """Copies ``start:stop`` of (dst, src, sizes) uint64 arrays: streaming stores if built."""
    dst, src, sizes = arrays
    native = page_copier()
    if native is not None:
        item = dst.itemsize
        native(
            stop - start,
            dst.ctypes.data + start * item,
            src.ctypes.data + start * item,
            sizes.ctypes.data + start * item,
        )
        return
    memmove_all(dst[start:stop].tolist(), src[start:stop].tolist(), sizes[start:stop].tolist())


def memmove_all(dsts: list[int], srcs: list[int], sizes: list[int]) -> None:
    """The pure-Python path: one ``ctypes.memmove`` per copy."""
    memmove = ctypes.memmove
    for dst, src, size in zip(dsts, srcs, sizes, strict=True):
        memmove(dst, src, size)


class _DirectionQueue:
    """A FIFO of copy jobs drained by one daemon thread."""

    def __init__(self, name: str, on_done: Callable[[CopyJob], None], parts: int = 1) -> None:
        self._jobs: queue.SimpleQueue[CopyJob | None] = queue.SimpleQueue()
        self._on_done = on_done
        self._parts = parts
        self._helpers = (
            ThreadPoolExecutor(
                parts - 1, thread_name_prefix=f"{name}-part", initializer=name_os_thread
            )
            if parts > 1
            else None
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: CopyJob) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        """Finish every queued job, then stop the thread."""
        self._jobs.put(None)
        self._thread.join()
        if self._helpers is not None:
            self._helpers.shutdown()

    def _run(self) -> None:
        name_os_thread()
        while (job := self._jobs.get()) is not None:
            start = time.perf_counter()
            try:
                run_plan(job.plan, self._helpers, self._parts)
            except BaseException as exc:
                logger.exception("kvtier: copy job %d failed", job.job_id)
                job.error = exc
            job.elapsed_s = time.perf_counter() - start
            self._on_done(job)


class CopyEngine:
    """Runs store and load copy jobs on two background threads.

    Thread affinity: ``submit_*``, ``take_finished`` and ``wait`` are called from the engine's
    worker thread; completion bookkeeping happens under a lock shared with the copy threads.
    """

    def __init__(self, load_parts: int | None = None) -> None:
        """``load_parts``: threads a large load is split over (default: usable CPUs, <= 4)."""
        self._lock = threading.Lock()
        self._finished: deque[CopyJob] = deque()
        self._pending: dict[int, CopyJob] = {}
        parts = load_parts if load_parts is not None else min(usable_cpus(), MAX_SPLIT)
        page_copier()  # load the native copier (or warn it is missing) now, not mid-restore
        self._stores = _DirectionQueue("kvtier-store-copy", self._complete)
        self._loads = _DirectionQueue("kvtier-load-copy", self._complete, max(1, parts))

    def submit_store(self, job_id: int, plan: CopyPlan) -> None:
        self._submit(self._stores, job_id, plan)

    def submit_load(self, job_id: int, plan: CopyPlan) -> None:
        self._submit(self._loads, job_id, plan)

    def _submit(self, direction: _DirectionQueue, job_id: int, plan: CopyPlan) -> None:
        job = CopyJob(job_id, plan)
        with self._lock:
            self._pending[job_id] = job
        direction.submit(job)

    def _complete(self, job: CopyJob) -> None:
        with self._lock:
            self._pending.pop(job.job_id, None)
            self._finished.append(job)
        job.done.set()

    def take_finished(self) -> list[CopyJob]:
        """Jobs completed since the last call, in completion order."""
        with self._lock:
            jobs = list(self._finished)
            self._finished.clear()
        return jobs

    def wait(self, job_ids: set[int]) -> None:
        """Block until every listed job that is still running has finished."""
        with self._lock:
            jobs = [self._pending[j] for j in job_ids if j in self._pending]
        for job in jobs:
            job.done.wait()

    def close(self) -> None:
        """Drain both queues (a copy under way is never cut short), then stop the threads."""
        self._stores.close()
        self._loads.close()
