"""What the disk tier's writes cost an engine loop that runs Python in the same process.

On CUDA with one GPU, vLLM's scheduler, the offloading tiers' I/O threads and the model
runner share one process, and in eager mode the runner launches every kernel from Python:
any Python an I/O thread runs takes the GIL from the loop, and every GIL hand-over may make
the loop wait out the interpreter's switch interval. This benchmark reproduces that: the main
thread runs an engine-like loop (steps of many small Python sections, each followed by a short
call that releases the GIL, as a torch op does), while writer threads write records at a fixed
rate of bytes per second from a page-aligned pool:

* ``none``: nothing beside the loop (the baseline);
* ``fs``: what vLLM's stock ``fs`` tier does per block: ``open(O_DIRECT)``, ``write``,
  ``close``, ``replace``;
* ``kvtier``: kvtier's write path one block at a time, ``RowIO.store_many`` of one block ->
  ``DiskStore.put_many`` of one record (what a single ``put`` does);
* ``kvtier-batch``: the same path with ``batch_records`` blocks per call, as the tier's store
  tasks write a thread's share of a job: one reservation and one commit per batch;
* ``kvtier-pywrite``: ``kvtier-batch`` with the record files written by the Python steps instead
  of the native writer's one call per batch (``RecordWriter.write_records``);
* ``kvtier-nohash``: the same without the payload checksum (bisect);
* ``kvtier-noindex``: header + checksum + temp file + rename, without the SQLite index (bisect);
* ``kvtier-nopayload``: ``DiskStore.put`` writing only the header page (the index, the glue and
  the checksum, without the payload's write) (bisect).

A setting named with ``/process`` (``kvtier/process``) runs the loop in a process of its own
instead: the writers then compete with it for the CPU only, not for the GIL, so the difference
between the two is the GIL's share of the cost.

Settings run interleaved (A B C ... then again), several rounds; the table gives medians over
rounds of the loop's steps per second and step-time p50/p99, and what the writers achieved.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import multiprocessing
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from kvtier.format import Namespace
from kvtier.format.checksum import Buffer
from kvtier.format.record import RecordHeader
from kvtier.runtime.health import TierHealth
from kvtier.runtime.row_io import RowIO
from kvtier.runtime.row_layout import RowLayout
from kvtier.runtime.stats import TierStats
from kvtier.store import DiskStore
from kvtier.store.disk import store as disk_store_module
from kvtier.store.disk.record_io import RecordIO
from kvtier.store.disk.writer import RecordWriter

SETTINGS = (
    "none",
    "fs",
    "kvtier",
    "kvtier-batch",
    "kvtier-pywrite",
    "kvtier-nohash",
    "kvtier-noindex",
    "kvtier-nopayload",
)

#: A setting's suffix that runs the loop in a process of its own: the writers then share the
#: CPU with it but not the GIL (the control that tells the GIL's cost from the CPU's).
PROCESS_SUFFIX = "/process"

#: Bytes the loop's GIL-releasing call hashes: hashlib drops the GIL from 2 KiB on, so each
#: call is a few microseconds without it, about what a kernel launch takes.
RELEASE_BYTES = 4096
#: Host-pool rows the writers cycle through.
POOL_ROWS = 16
#: Records per call of ``kvtier-batch`` by default (a write thread's share of a store job of
#: 32 blocks on 4 threads).
BATCH_RECORDS = 8


@dataclass(frozen=True)
class LoopShape:
    """The engine-like loop on the main thread."""

    #: Python sections per step (each followed by one GIL-releasing call).
    ops_per_step: int = 300
    #: Loop iterations of one section (pure Python).
    section_iterations: int = 40


@dataclass
class RoundResult:
    """One setting's run in one round."""

    setting: str
    steps_per_s: float
    step_p50_ms: float
    step_p99_ms: float
    written_mb_per_s: float
    puts: int
    #: CPU seconds the writer threads used per put (GIL held or not).
    writer_cpu_ms_per_put: float
    #: CPU the loop's thread used per step: above ``none``'s, the same work ran slower on
    #: the CPU (shared caches or cores), not only waited.
    loop_cpu_ms_per_step: float = 0.0
    #: Times the loop's thread blocked per step (its voluntary context switches): above
    #: ``none``'s, mostly waits for the GIL a writer holds, the hand-overs that cost a
    #: serving engine's loop its steps (docs/store.md, "What a put costs the engine").
    loop_waits_per_step: float = 0.0


def _voluntary_switches() -> int:
    """Times this thread has blocked so far (Linux; 0 elsewhere)."""
    try:
        with open("/proc/thread-self/status") as status:
            for line in status:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _engine_loop(shape: LoopShape, seconds: float) -> tuple[list[float], float, int]:
    """Run steps for ``seconds``: each step's duration, the CPU seconds the loop's thread
    used (a step that only waits costs none; one slowed by caches or CPUs shared costs more)
    and the times it blocked."""
    chunk = bytes(RELEASE_BYTES)
    steps: list[float] = []
    cpu_started = time.thread_time()
    waits_before = _voluntary_switches()
    end = time.perf_counter() + seconds
    while True:
        started = time.perf_counter()
        if started >= end:
            waits = _voluntary_switches() - waits_before
            return steps, time.thread_time() - cpu_started, waits
        for _ in range(shape.ops_per_step):
            total = 0
            for i in range(shape.section_iterations):
                total += i
            hashlib.sha1(chunk).digest()
        steps.append(time.perf_counter() - started)


def _loop_in_child(send: Connection, shape: LoopShape, seconds: float) -> None:
    started = time.perf_counter()
    steps, cpu_s, waits = _engine_loop(shape, seconds)
    send.send((steps, time.perf_counter() - started, cpu_s, waits))


class Pacer:
    """Hands out write slots at a fixed rate of records per second to several threads."""

    def __init__(self, records_per_s: float) -> None:
        self._interval = 1.0 / records_per_s
        self._next = time.perf_counter()
        self._lock = threading.Lock()
        self.stopped = threading.Event()

    def wait_slot(self) -> bool:
        """Sleep until this thread's next slot; False once stopped."""
        with self._lock:
            due = self._next
            self._next += self._interval
        delay = due - time.perf_counter()
        if delay > 0:
            self.stopped.wait(delay)
        return not self.stopped.is_set()


def header_without_checksum(
    digest: bytes, key: bytes, payload: Buffer, payload_checksum: int | None = None
) -> RecordHeader:
    """The disk store's header builder less the payload checksum (a diagnosis: such a record
    never loads)."""
    return RecordHeader(
        namespace_digest=digest,
        key=key,
        payload_len=memoryview(payload).nbytes,
        payload_checksum=0,
        checksum_alg=1,
    )


def skip_checksums(module: Any) -> Callable[[], None]:
    """Make the disk store ``module`` write records without computing their payload
    checksums (the ``kvtier-nohash`` setting, the GPU runner's ``kvtier-nochecksum`` trial);
    returns what undoes it."""
    originals = module.make_header, module.compute_checksums
    module.make_header = header_without_checksum
    module.compute_checksums = lambda data: [0] * len(data)

    def undo() -> None:
        module.make_header, module.compute_checksums = originals

    return undo


class _NoChecksum:
    """Swaps the store's checksums for none (bisect)."""

    @staticmethod
    @contextlib.contextmanager
    def applied() -> Iterator[None]:
        undo = skip_checksums(disk_store_module)
        try:
            yield
        finally:
            undo()


class _HeaderOnlyWriter(RecordWriter):
    """Writes the header page only: the put's index work and glue without the payload."""

    def write_file(self, path: Path, header: Buffer, payload: memoryview, direct: bool) -> None:
        super().write_file(path, header, memoryview(b""), direct=False)


class _PythonStepsWriter(RecordWriter):
    """The record writer's Python steps: a subclass overriding a step never writes natively."""

    def publish(self, temp: Path, final: Path) -> None:
        super().publish(temp, final)


def _namespace(record_bytes: int) -> Namespace:
    """A Llama-3-8B-shaped namespace (bfloat16, 8 KV heads of 128, 32 layers)."""
    return Namespace(
        model="write-cost-bench",
        weights_fingerprint="",
        kv_dtype="bfloat16",
        block_size_tokens=record_bytes // (32 * 2 * 8 * 128 * 2),
        num_groups=1,
        num_layers=32,
        num_kv_heads=8,
        head_size=128,
        block_bytes=record_bytes,
        hash_algorithm="sha256_cbor",
    )


def store_rows(pool: memoryview, record_bytes: int, store: DiskStore, label: str) -> RowIO:
    """The tier's row I/O over ``pool`` (rows of one record each) into ``store``: the path an
    engine's store jobs take (``RowIO.store_many``, ``store_share``)."""
    layout = RowLayout(segment_bytes=record_bytes, segment_slices=(0,), slices=("all",))
    return RowIO(
        pool,
        record_bytes,
        layout,
        wait_store=lambda: store,
        stats=TierStats(),
        health=TierHealth(time.monotonic),
        label=label,
    )


def _block_key(n: int) -> bytes:
    """Block ``n``'s key, hashed as vLLM's are: records spread over the store's 256 fan-out
    folders, as in an engine, not all into one."""
    return hashlib.sha256(n.to_bytes(8, "big")).digest()[:16]


@contextlib.contextmanager
def _writer(
    setting: str, folder: Path, pool: memoryview, record_bytes: int, batch_records: int
) -> Iterator[tuple[Callable[[int, int], None], int]]:
    """A function writing call number ``n`` from pool row ``row`` on, for ``setting``, and
    how many records one call writes (``batch_records`` for ``kvtier-batch``, else 1: record
    ``n`` from row ``row``)."""
    rows = [pool[r * record_bytes : (r + 1) * record_bytes] for r in range(POOL_ROWS)]
    if setting == "fs":
        # vLLM's fs tier: a file per block under a two-level fan-out, replaced in place.
        slots = 64
        for s in range(slots):
            (folder / f"{s:02x}").mkdir(exist_ok=True)

        def write_fs(n: int, row: int) -> None:
            final = folder / f"{n % slots:02x}" / f"{n % 1024}.bin"
            temp = final.with_suffix(f".{threading.get_ident()}.tmp")
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o600)
            try:
                os.write(fd, rows[row])
            finally:
                os.close(fd)
            os.replace(temp, final)

        yield write_fs, 1
        return
    if setting == "kvtier-noindex":
        writer = RecordWriter()
        digest = _namespace(record_bytes).digest()
        (folder / "blocks").mkdir()

        def write_noindex(n: int, row: int) -> None:
            from kvtier.format.record import encode_header, make_header

            key = _block_key(n)
            header = encode_header(make_header(digest, key, rows[row]))
            temp = folder / f"{n}.{threading.get_ident()}.tmp"
            final = folder / "blocks" / f"{n % 1024}.rec"
            (failed,) = writer.write_records([(temp, final, header, rows[row])])
            if failed is not None:
                raise failed

        yield write_noindex, 1
        return
    io = {
        "kvtier-nopayload": RecordIO(_HeaderOnlyWriter()),
        "kvtier-pywrite": RecordIO(_PythonStepsWriter()),
    }.get(setting)
    store = DiskStore(
        folder,
        _namespace(record_bytes),
        capacity_bytes=max(256 * record_bytes, 1 << 30),
        free_space_floor_bytes=0,
        io=io,
    )
    row_io = store_rows(pool, record_bytes, store, "bench")
    patched = _NoChecksum.applied() if setting == "kvtier-nohash" else contextlib.nullcontext()

    per_call = batch_records if setting in ("kvtier-batch", "kvtier-pywrite") else 1

    def write_kvtier(n: int, row: int) -> None:
        numbers = range(n * per_call, (n + 1) * per_call)
        keys = [_block_key(i) for i in numbers]
        rows = [(row + i) % POOL_ROWS for i in range(per_call)]
        if not all(row_io.store_many(store, keys, rows)):
            raise RuntimeError("a put failed (see the log)")

    try:
        with patched:
            yield write_kvtier, per_call
    finally:
        store.close()
        row_io.release()


def run_setting(
    setting: str,
    folder: Path,
    pool: memoryview,
    record_bytes: int,
    bytes_per_s: float,
    threads: int,
    seconds: float,
    shape: LoopShape,
    loop_process: bool = False,
    batch_records: int = BATCH_RECORDS,
) -> RoundResult:
    """The loop's steps beside ``threads`` writers of ``setting`` at ``bytes_per_s``;
    ``loop_process``: the loop runs in a process of its own (it shares the CPU with the
    writers, not the GIL); ``batch_records``: records per call of ``kvtier-batch``."""
    puts = 0
    writer_cpu_s = 0.0
    count_lock = threading.Lock()
    errors: list[BaseException] = []
    with (
        _writer(setting, folder, pool, record_bytes, batch_records)
        if setting != "none"
        else contextlib.nullcontext((None, 1))
    ) as (write, per_call):
        pacer: Pacer | None = None
        numbers = iter(range(1 << 62))

        def work() -> None:
            nonlocal puts, writer_cpu_s
            assert pacer is not None  # made before the threads start
            cpu_started = time.thread_time()
            try:
                while pacer.wait_slot():
                    with count_lock:
                        n = next(numbers)
                    write(n, n % POOL_ROWS)
                    with count_lock:
                        puts += per_call
            except BaseException as exc:  # reported after the round
                errors.append(exc)
            finally:
                with count_lock:
                    writer_cpu_s += time.thread_time() - cpu_started

        workers = [threading.Thread(target=work, daemon=True) for _ in range(threads)]
        child = None
        if loop_process:
            # Forked before the writers start, so it holds none of their locks.
            receive, send = multiprocessing.Pipe(duplex=False)
            child = multiprocessing.get_context("fork").Process(
                target=_loop_in_child, args=(send, shape, seconds), daemon=True
            )
            child.start()
        # Made once the child runs, so a slow fork leaves no missed slots to catch up on.
        pacer = Pacer(bytes_per_s / record_bytes / per_call)
        writing_from = time.perf_counter()
        if write is not None:
            for worker in workers:
                worker.start()
        if child is None:
            started = time.perf_counter()
            steps, loop_cpu_s, loop_waits = _engine_loop(shape, seconds)
            elapsed = time.perf_counter() - started
        else:
            steps, elapsed, loop_cpu_s, loop_waits = receive.recv()
            child.join()
        pacer.stopped.set()
        writing_s = time.perf_counter() - writing_from
        for worker in workers if write is not None else []:
            worker.join()
    if errors:
        raise errors[0]
    ordered = sorted(steps)
    return RoundResult(
        setting=setting,
        steps_per_s=len(steps) / elapsed,
        step_p50_ms=1e3 * statistics.median(ordered),
        step_p99_ms=1e3 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        written_mb_per_s=puts * record_bytes / writing_s / 1e6,
        puts=puts,
        writer_cpu_ms_per_put=1e3 * writer_cpu_s / max(puts, 1),
        loop_cpu_ms_per_step=1e3 * loop_cpu_s / max(len(steps), 1),
        loop_waits_per_step=loop_waits / max(len(steps), 1),
    )


def run(
    settings: list[str],
    record_bytes: int,
    bytes_per_s: float,
    threads: int = 4,
    seconds: float = 4.0,
    rounds: int = 3,
    shape: LoopShape | None = None,
    folder: Path | None = None,
    on_round: Callable[[RoundResult], None] | None = None,
    batch_records: int = BATCH_RECORDS,
) -> dict[str, list[RoundResult]]:
    """Every setting once per round, in order (ABC ABC ...); the results by setting."""
    unknown = [s for s in settings if s.removesuffix(PROCESS_SUFFIX) not in SETTINGS]
    if unknown:
        raise ValueError(f"unknown setting(s) {unknown}; choose from {SETTINGS}")
    if record_bytes % mmap.PAGESIZE:
        raise ValueError(f"record bytes {record_bytes} must be whole pages (O_DIRECT)")
    shape = shape or LoopShape()
    pool_map = mmap.mmap(-1, POOL_ROWS * record_bytes)
    pool = memoryview(pool_map)
    for r in range(POOL_ROWS):  # distinct, non-zero rows
        pool[r * record_bytes : r * record_bytes + 8] = r.to_bytes(8, "little", signed=False)
    base = Path(tempfile.mkdtemp(prefix="kvtier-write-cost-", dir=folder))
    results: dict[str, list[RoundResult]] = {s: [] for s in settings}
    try:
        for round_index in range(rounds):
            for setting in settings:
                target = base / f"{setting.replace('/', '-')}-{round_index}"
                target.mkdir()
                try:
                    result = run_setting(
                        setting.removesuffix(PROCESS_SUFFIX),
                        target,
                        pool,
                        record_bytes,
                        bytes_per_s,
                        threads,
                        seconds,
                        shape,
                        loop_process=setting.endswith(PROCESS_SUFFIX),
                        batch_records=batch_records,
                    )
                    result.setting = setting
                finally:
                    shutil.rmtree(target, ignore_errors=True)
                results[setting].append(result)
                if on_round is not None:
                    on_round(result)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        pool.release()
        pool_map.close()
    return results


def table(results: dict[str, list[RoundResult]], record_bytes: int, bytes_per_s: float) -> str:
    """Medians over rounds, per setting, as a Markdown table."""
    base = results.get("none")
    base_rate = statistics.median(r.steps_per_s for r in base) if base else None
    lines = [
        f"records of {record_bytes / (1 << 20):g} MiB, target {bytes_per_s / 1e6:.0f} MB/s "
        f"(medians over {max(len(v) for v in results.values())} rounds)",
        "",
        "| setting | loop steps/s | vs none | step p50 ms | step p99 ms | written MB/s "
        "| writer CPU ms/put | loop CPU ms/step | loop waits/step |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for setting, rounds in results.items():
        rate = statistics.median(r.steps_per_s for r in rounds)
        ratio = f"{rate / base_rate:.2f}" if base_rate else "-"
        lines.append(
            f"| {setting} | {rate:.1f} | {ratio} "
            f"| {statistics.median(r.step_p50_ms for r in rounds):.2f} "
            f"| {statistics.median(r.step_p99_ms for r in rounds):.2f} "
            f"| {statistics.median(r.written_mb_per_s for r in rounds):.0f} "
            f"| {statistics.median(r.writer_cpu_ms_per_put for r in rounds):.2f} "
            f"| {statistics.median(r.loop_cpu_ms_per_step for r in rounds):.3f} "
            f"| {statistics.median(r.loop_waits_per_step for r in rounds):.2f} |"
        )
    return "\n".join(lines)
