"""Every time a write thread takes the GIL back during a batch of puts, counted and placed.

A write thread that gives the GIL up (a SQLite step, a system call, a native call, a queue
wait) must take it back when the call returns, and on a GPU host that is a wait for the
engine's loop, which then waits in turn (docs/store.md, "What a put costs the engine"). This
tool counts those re-acquisitions exactly: a ``perf`` uprobe on ``PyEval_RestoreThread`` (every
``Py_END_ALLOW_THREADS`` goes through it) in this process, while one write thread stores
batches through the tier's path (``JobTable.submit_stores`` -> ``RowIO.store_share`` ->
``DiskStore.put_many``), and a profile hook on that thread logs its calls with the same clock,
so each re-acquisition is charged to the call it returned from and that call's callers.

The store is warm as an engine's is after a while: its 256 fan-out folders exist (the first
record into a folder costs four more: the rename that fails, a stat, the mkdir, the rename),
hashed keys; with ``--evicting`` it is full, so every batch evicts as many records as it adds.
The free-space floor is the default one (one ``statvfs`` a reservation).

Needs ``perf`` with uprobes (root, or ``perf_event_paranoid`` allowing it) and a CPython with
symbols for ``PyEval_RestoreThread``. The profile hook slows the thread, which changes nothing
counted except what is measured once a second (the decision files), shown as fractions.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import hashlib
import mmap
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

from benchmarks.write_cost import _block_key, _namespace, store_rows
from kvtier.runtime.jobs import STORE_BATCH_BLOCKS, JobTable
from kvtier.store import DiskStore
from kvtier.store.disk import layout

#: The write pool's thread name prefix (its OS name is the first 15 bytes of "<prefix>-write_0").
THREAD_PREFIX = "kvho"
#: Python frames shown above the call a re-acquisition returned from.
CALLERS_SHOWN = 3


@dataclass
class Account:
    """What one run counted."""

    batches: int
    #: Re-acquisitions by where they happened (innermost call first).
    sites: collections.Counter[str] = field(default_factory=collections.Counter)
    python: str = ""

    @property
    def total(self) -> int:
        return sum(self.sites.values())


def libpython() -> str:
    """The file holding ``PyEval_RestoreThread`` for this interpreter."""
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        name = sysconfig.get_config_var("INSTSONAME") or sysconfig.get_config_var("LDLIBRARY")
        return str(Path(sysconfig.get_config_var("LIBDIR")) / name)
    return os.path.realpath(sys.executable)


def check_perf() -> None:
    """Raise ``RuntimeError`` naming the fix where this tool cannot count: no ``perf``, or not
    allowed to place uprobes (root, or ``kernel.perf_event_paranoid`` of -1)."""
    if shutil.which("perf") is None:
        raise RuntimeError("handovers needs perf on PATH (the linux-tools package of the kernel)")
    if os.geteuid() != 0:
        raise RuntimeError("handovers places a perf uprobe: run it as root")


def _probe_event(library: str) -> str:
    """The uprobe event on ``PyEval_RestoreThread`` of ``library``, added if missing."""
    listed = subprocess.run(["perf", "probe", "-l"], capture_output=True, text=True).stdout
    for line in listed.splitlines():
        if "PyEval_RestoreThread" in line and library in line:
            return line.split()[0]
    # Named after the library: perf's default name is the binary's up to its first dot, the
    # same for every CPython ("python3"), so a second interpreter's probe would collide.
    name = "kvho_" + hashlib.sha1(library.encode()).hexdigest()[:10]
    added = subprocess.run(
        ["perf", "probe", "-x", library, f"{name}=PyEval_RestoreThread"],
        capture_output=True,
        text=True,
    )
    for line in added.stderr.splitlines():
        if "-e " in line:
            return line.split("-e ")[1].split()[0]
    raise RuntimeError(f"perf probe on {library} failed: {added.stderr.strip()}")


class _CallLog:
    """Timestamped call events of the threads whose names start with ``prefix``, by thread."""

    def __init__(self, prefix: str) -> None:
        self._prefix = prefix
        self.events: dict[int, list[tuple[int, str, str]]] = collections.defaultdict(list)
        #: Events are logged only while on (the hook is set before the thread starts).
        self.on = False

    def hook(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or not threading.current_thread().name.startswith(self._prefix):
            return
        now = time.monotonic_ns()
        events = self.events[threading.get_native_id()]
        if event == "c_call":
            name = getattr(arg, "__qualname__", None) or repr(arg)
            events.append((now, "enter", f"C {name}"))
        elif event in ("c_return", "c_exception", "return"):
            events.append((now, "leave", ""))
        elif event == "call":
            code = frame.f_code
            events.append((now, "enter", f"{Path(code.co_filename).name}:{code.co_name}"))

    def stacks(self, tid: int) -> tuple[list[int], list[tuple[str, ...]]]:
        """Thread ``tid``'s call stack after each of its events, for ``bisect`` by time."""
        stack: list[str] = []
        times, stacks = [], []
        for when, kind, name in self.events.get(tid, []):
            if kind == "enter":
                stack.append(name)
            elif stack:
                stack.pop()
            times.append(when)
            stacks.append(tuple(stack))
        return times, stacks


@contextlib.contextmanager
def _recording(event: str, output: Path) -> Iterator[None]:
    """``perf record`` of ``event`` in this process for the block's duration."""
    command = ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-e", event, "-o", str(output)]
    perf = subprocess.Popen(
        [*command, "-p", str(os.getpid())],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(1.0)  # perf attaches its probes
    try:
        yield
    finally:
        perf.send_signal(signal.SIGINT)
        perf.wait(30)


def _acquisitions(data: Path, comm_prefix: str) -> list[tuple[int, int]]:
    """(thread id, CLOCK_MONOTONIC nanoseconds) of each recorded event of the threads named
    so."""
    script = subprocess.run(
        ["perf", "script", "-i", str(data), "-F", "comm,tid,time"], capture_output=True, text=True
    ).stdout
    found = []
    for line in script.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].startswith(comm_prefix):
            found.append((int(parts[1]), round(float(parts[-1].rstrip(":")) * 1e9)))
    return found


def run(
    batches: int = 40,
    batch_records: int = STORE_BATCH_BLOCKS,
    record_kib: int = 256,
    evicting: bool = False,
    folder: Path | None = None,
    threads: int = 1,
) -> Account:
    """Store ``batches`` batches of ``batch_records`` hashed keys and count the write
    threads' GIL re-acquisitions, by call site; ``threads`` > 1: each job is one batch a
    write thread, written side by side (their locks then contend)."""
    check_perf()
    event = _probe_event(libpython())
    record_bytes = record_kib << 10
    rows = 2 * batch_records * threads
    pool_map = mmap.mmap(-1, rows * record_bytes)
    pool = memoryview(pool_map)
    base = Path(tempfile.mkdtemp(prefix="kvtier-handovers-", dir=folder))
    # Full: about 100 batches of records, so every batch evicts (the low watermark frees
    # room for a few batches at a time; at most TXN_ROWS_MAX a reservation).
    capacity = (8 << 20) + 100 * batch_records * record_bytes if evicting else 1 << 40
    store = DiskStore(base, _namespace(record_bytes), capacity_bytes=capacity)
    for fan in range(256):
        (store.namespace_dir / layout.BLOCKS / f"{fan:02x}").mkdir(exist_ok=True)
    row_io = store_rows(pool, record_bytes, store, "handovers")
    jobs = JobTable(
        thread_prefix=THREAD_PREFIX, io_threads=threads, clock=time.monotonic, label="handovers"
    )
    numbers = iter(range(1 << 62))
    blocks = batch_records * threads

    def store_batch(job_id: int) -> None:
        keys = [_block_key(next(numbers)) for _ in range(blocks)]
        jobs.submit_stores(job_id, keys, list(range(blocks)), row_io.store_share)
        while not jobs.finished():
            time.sleep(0.001)

    calls = _CallLog(f"{THREAD_PREFIX}-write")
    data = base / "perf.data"
    threading.setprofile(calls.hook)  # for the write thread, started by the first job
    try:
        for job_id in range((150 if evicting else 2) // threads + 1):  # store full, threads up
            store_batch(job_id)
        with _recording(event, data):
            calls.on = True
            for job_id in range(batches):
                store_batch(1000 + job_id)
                time.sleep(0.002)  # the next job waits for work, as in an engine
            calls.on = False
        acquired = _acquisitions(data, f"{THREAD_PREFIX}-write")
    finally:
        threading.setprofile(None)
        jobs.shutdown(5.0)
        store.close()
        row_io.release()
        pool.release()
        pool_map.close()
        shutil.rmtree(base, ignore_errors=True)
    account = Account(batches * threads, python=sys.version.split()[0])
    by_thread = {tid: calls.stacks(tid) for tid in {tid for tid, _ in acquired}}
    for tid, when in acquired:
        times, stacks = by_thread[tid]
        at = bisect.bisect_right(times, when) - 1
        stack = stacks[at] if at >= 0 else ()
        account.sites[" < ".join(reversed(stack[-1 - CALLERS_SHOWN :])) or "(idle)"] += 1
    return account


def table(account: Account) -> str:
    """Re-acquisitions per batch by call site, as a Markdown table."""
    lines = [
        f"GIL re-acquisitions of the write threads: {account.total / account.batches:.2f} a "
        f"batch ({account.batches} batches; Python {account.python})",
        "",
        "| per batch | where (the call it returned from < its callers) |",
        "|---:|---|",
    ]
    for site, count in account.sites.most_common():
        lines.append(f"| {count / account.batches:.2f} | {site} |")
    return "\n".join(lines)
