"""Background memory copies for the CPU data plane.

vLLM's CUDA worker hands copies to DMA streams; on the CPU backend the engine's KV cache and the
host pool are both ordinary memory, so a copy is a ``memmove``. Running the copies on our own
threads keeps them off the engine's step thread: ``ctypes.memmove`` releases the GIL, so the
model's forward pass and a long restore overlap.

Two queues, one per direction, each executed in submission order (upstream's ordering contract:
transfers of one direction are serialised). Loads get their own thread so a burst of stores
never delays a restore, which is on the time-to-first-token path.
"""

import ctypes
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtier.vllm.host_layout import CopyPlan

logger = logging.getLogger(__name__)


@dataclass
class CopyJob:
    """One transfer: a copy plan plus its completion state."""

    job_id: int
    plan: CopyPlan
    done: threading.Event = field(default_factory=threading.Event)
    elapsed_s: float = 0.0
    error: BaseException | None = None


def run_plan(plan: CopyPlan) -> None:
    """Execute every copy of ``plan`` (blocking; releases the GIL per copy)."""
    memmove = ctypes.memmove
    for dst, src, size in zip(
        plan.dst.tolist(), plan.src.tolist(), plan.sizes.tolist(), strict=True
    ):
        memmove(dst, src, size)


class _DirectionQueue:
    """A FIFO of copy jobs drained by one daemon thread."""

    def __init__(self, name: str, on_done: Callable[[CopyJob], None]) -> None:
        self._jobs: queue.SimpleQueue[CopyJob | None] = queue.SimpleQueue()
        self._on_done = on_done
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: CopyJob) -> None:
        self._jobs.put(job)

    def close(self) -> None:
        """Finish every queued job, then stop the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            start = time.perf_counter()
            try:
                run_plan(job.plan)
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

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._finished: deque[CopyJob] = deque()
        self._pending: dict[int, CopyJob] = {}
        self._stores = _DirectionQueue("kvtier-store-copy", self._complete)
        self._loads = _DirectionQueue("kvtier-load-copy", self._complete)

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
