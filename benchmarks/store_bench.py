"""DiskStore throughput and latency next to plain file I/O on the same disk.

Run: ``python -m benchmarks store [--dir DIR] [--total-mib 192] [--repeats 3]``.

Five tables:

1. Throughput for 0.5 MiB and 5.9 MiB blocks (5,898,240 B: SmolLM2-135M's 128-token fp32
   block): each case writes ``--total-mib`` of blocks, then reads them back cold (after
   ``sync`` and ``echo 3 > /proc/sys/vm/drop_caches``, when permitted) and warm (again at
   once). Plain rows write and read one file sequentially in block-sized chunks. "write+sync"
   also counts the ``sync`` that follows the pass, so buffered writes are charged for reaching
   the disk. GB/s = 10^9 B/s, median of ``--repeats`` passes; latencies are per block.
   "cached" is the share of the written bytes left in the page cache (``mincore``).
2. Cold reads, O_DIRECT against buffered, on the same records in alternating rounds (the
   fairest view of that choice on a noisy disk).
3. Threads: the default store driven by 1 and 4 threads (put then get of every block).
4. Index: open() time and ``contains()`` latency with ``--open-records`` records indexed
   (rows bulk-inserted into the index, no block files, since open never reads them), and
   open() after real puts of ``--real-records`` small records (with the put rate).
5. Sealing (encryption at rest): GB/s of one core sealing and opening a record of each block
   size, no disk. Table 1 has the sealed store beside the plain one ("DiskStore default,
   sealed"), and the same with the records spread over ``TENANTS`` tenants, each block put
   and got through its tenant's view of the one store (its own names and keys; the views are
   made before the pass, as a tier keeps them). ``--sealed-only`` measures only these: the
   seal/open table and table 1 with the default store, sealed for one tenant and for many.

Everything is written under a temporary folder in ``--dir`` and removed at the end.
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from benchmarks import busy_thread
from kvtier.bench.report import (
    drop_page_cache,
    environment_line,
    markdown_table,
    median,
    p50_p99,
    repeat_s,
)
from kvtier.format import HEADER_BYTES, Namespace
from kvtier.format.sealing import KeyRing, MasterKey, RecordSealer
from kvtier.store import DiskStore, RecordIO, RecordWriter, default_reader
from kvtier.store.disk.root import INDEX_ALLOWANCE_BYTES
from kvtier.threads import usable_cpus

BLOCK_SIZES = (512 << 10, 5_898_240)
#: Threads of the multi-threaded read A/B: the disk tier's default ``disk_threads``.
AB_THREADS = 4


@dataclass
class Pass:
    """One write + cold read + warm read pass."""

    write_s: float
    sync_s: float
    cold_s: float | None
    warm_s: float
    put_ms: list[float]
    get_ms: list[float]
    #: Share of the written bytes still in the page cache after the pass and a sync.
    resident: float


def capacity_for(count: int, block: int) -> int:
    """A folder cap that holds ``count`` records of ``block`` bytes with no eviction: the
    records, the eviction watermark's headroom, and the index files the cap also charges."""
    records = (count + 1) * (block + HEADER_BYTES)
    return int(records / 0.9) + 2 * INDEX_ALLOWANCE_BYTES


def resident_share(paths: list[Path]) -> float:
    """Share of the pages of ``paths`` that sit in the page cache (``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    resident = total = 0
    for path in paths:
        size = path.stat().st_size
        fd = os.open(path, os.O_RDONLY)
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        os.close(fd)
        pages = -(-size // mmap.PAGESIZE)
        vec = ctypes.create_string_buffer(pages)
        libc.mincore(addr, size, vec)
        libc.munmap(addr, size)
        resident += sum(b & 1 for b in vec.raw)
        total += pages
    return resident / total if total else 0.0


def namespace(block_bytes: int) -> Namespace:
    return Namespace(
        model="bench",
        weights_fingerprint="",
        kv_dtype="float32",
        block_size_tokens=128,
        num_groups=1,
        num_layers=30,
        num_kv_heads=3,
        head_size=64,
        block_bytes=block_bytes,
        hash_algorithm="sha256",
    )


def aligned(size: int, fill: bytes = b"") -> memoryview:
    view = memoryview(mmap.mmap(-1, size))
    if fill:
        view[:] = (fill * (size // len(fill) + 1))[:size]
    return view


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def store_pass(
    folder: Path,
    block: int,
    count: int,
    io: RecordIO,
    cold: bool,
    sealer: RecordSealer | None = None,
    ring: KeyRing | None = None,
    tenants: int = 0,
) -> Pass:
    """One pass of the store; with ``ring`` and ``tenants``, block i is put and got through
    tenant ``i % tenants``'s view (``sealer`` must then be the ring's default tenant's)."""
    store = DiskStore(
        folder,
        namespace(block),
        capacity_for(count, block),
        free_space_floor_bytes=0,
        io=io,
        sealer=sealer,
    )
    payload, out = aligned(block, os.urandom(4096)), aligned(block)
    keys = [i.to_bytes(36, "big") for i in range(count)]
    views = [store.tenant_view(ring.tenant(f"tenant-{t}")) for t in range(tenants)] if ring else []
    by_key = [views[i % len(views)] if views else store for i in range(count)]
    put_ms: list[float] = []
    get_ms: list[float] = []

    def write() -> None:
        for key, view in zip(keys, by_key, strict=True):
            put_ms.append(timed(lambda k=key, v=view: v.put(k, payload)) * 1e3)

    def read(record: bool) -> None:
        for key, view in zip(keys, by_key, strict=True):
            ms = timed(lambda k=key, v=view: v.get_into(k, out)) * 1e3
            if record:
                get_ms.append(ms)

    write_s = timed(write)
    sync_s = timed(os.sync)
    resident = resident_share(sorted(store.namespace_dir.glob("blocks/*/*")))
    cold_s = timed(lambda: read(True)) if cold and drop_page_cache() else None
    warm_s = timed(lambda: read(cold_s is None))
    if store.stats().hits != count * (2 if cold_s is not None else 1):
        raise RuntimeError(f"store missed: {store.stats()}")
    store.close()
    return Pass(write_s, sync_s, cold_s, warm_s, put_ms, get_ms, resident)


def plain_pass(folder: Path, block: int, count: int, direct: bool, cold: bool) -> Pass:
    path = folder / "plain.bin"
    folder.mkdir(parents=True, exist_ok=True)
    payload, out = aligned(block, os.urandom(4096)), aligned(block)
    extra = os.O_DIRECT if direct else 0
    put_ms: list[float] = []
    get_ms: list[float] = []

    def write() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | extra, 0o600)
        for _ in range(count):
            put_ms.append(timed(lambda: os.write(fd, payload)) * 1e3)
        os.close(fd)

    def read(record: bool) -> None:
        fd = os.open(path, os.O_RDONLY | extra)
        for i in range(count):
            ms = timed(lambda i=i: os.preadv(fd, [out], i * block)) * 1e3
            if record:
                get_ms.append(ms)
        os.close(fd)

    write_s = timed(write)
    sync_s = timed(os.sync)
    resident = resident_share([path])
    cold_s = timed(lambda: read(True)) if cold and drop_page_cache() else None
    warm_s = timed(lambda: read(cold_s is None))
    path.unlink()
    return Pass(write_s, sync_s, cold_s, warm_s, put_ms, get_ms, resident)


def _store_case(
    direct_reads: bool = True, **writer_options: object
) -> Callable[[Path, int, int, bool], Pass]:
    def case(d: Path, b: int, n: int, c: bool) -> Pass:
        writer = RecordWriter(**writer_options)  # type: ignore[arg-type]
        return store_pass(d, b, n, RecordIO(writer, default_reader(direct_reads)), c)

    return case


def bench_sealer() -> RecordSealer:
    """The default tenant's sealer under a random master key (needs the encryption extra)."""
    return KeyRing([MasterKey(os.urandom(32))]).tenant()


def tenants_pass(d: Path, b: int, n: int, c: bool) -> Pass:
    ring = KeyRing([MasterKey(os.urandom(32))])
    return store_pass(d, b, n, RecordIO(), c, ring.tenant(), ring, TENANTS)


#: Tenants the many-tenant sealed case spreads its records over.
TENANTS = 64
#: The sealed store's case: the default store, records sealed (AES-256-GCM).
SEALED_CASE = "DiskStore default, sealed (AES-256-GCM)"
#: The same, each block of one of ``TENANTS`` tenants, under its keys.
SEALED_TENANTS_CASE = f"DiskStore default, sealed, records of {TENANTS} tenants"
PLAIN_CASE = "DiskStore default: fsync=never, O_DIRECT writes+reads"

CASES: dict[str, Callable[[Path, int, int, bool], Pass]] = {
    "plain file, buffered": lambda d, b, n, c: plain_pass(d, b, n, False, c),
    "plain file, O_DIRECT": lambda d, b, n, c: plain_pass(d, b, n, True, c),
    PLAIN_CASE: _store_case(),
    SEALED_CASE: lambda d, b, n, c: store_pass(d, b, n, RecordIO(), c, bench_sealer()),
    SEALED_TENANTS_CASE: tenants_pass,
    "DiskStore, buffered writes + DONTNEED": _store_case(direct_writes=False),
    "DiskStore, buffered writes, no fadvise": _store_case(
        direct_writes=False, drop_written_pages=False
    ),
    "DiskStore, buffered reads": _store_case(direct_reads=False),
    "DiskStore fsync=data": _store_case(fsync="data"),
    "DiskStore fsync=always": _store_case(fsync="always"),
}


def gbps(total: int, seconds: list[float]) -> str:
    return f"{total / median(seconds) / 1e9:.2f}" if seconds else "n/a"


def throughput(
    work: Path, total_mib: int, repeats: int, cold: bool, cases: tuple[str, ...] = tuple(CASES)
) -> tuple[str, dict]:
    rows, raw = [], {}
    for block in BLOCK_SIZES:
        count = max(4, (total_mib << 20) // block)
        total = count * block
        for name in cases:
            case = CASES[name]
            passes = []
            for r in range(repeats):
                folder = work / f"{block}-{r}"
                passes.append(case(folder, block, count, cold))
                shutil.rmtree(folder, ignore_errors=True)
            puts = [ms for p in passes for ms in p.put_ms]
            gets = [ms for p in passes for ms in p.get_ms]
            colds = [p.cold_s for p in passes if p.cold_s is not None]
            rows.append(
                [
                    name,
                    f"{block / (1 << 20):.2f} MiB",
                    gbps(total, [p.write_s for p in passes]),
                    gbps(total, [p.write_s + p.sync_s for p in passes]),
                    gbps(total, colds),
                    gbps(total, [p.warm_s for p in passes]),
                    p50_p99(puts),
                    p50_p99(gets),
                    f"{median([p.resident for p in passes]):.0%}",
                ]
            )
            raw[f"{name} @ {block}"] = [p.__dict__ for p in passes]
    header = [
        "case",
        "block",
        "write GB/s",
        "write+sync GB/s",
        "read cold GB/s",
        "read warm GB/s",
        "put/write ms p50 / p99",
        "get/read ms p50 / p99 (cold)",
        "cached after write+sync",
    ]
    return markdown_table(header, rows), raw


def seal_rates(total_mib: int, repeats: int) -> tuple[str, dict]:
    """GB/s of one thread sealing and opening a record of each ``BLOCK_SIZES`` size in memory
    (no disk): what sealing adds to a put and a get, per core.

    Seal is the put's path (encrypt into the thread's buffer, then the ciphertext checksum);
    open is the get's (decrypt, the tag checked, no checksum pass; a get decrypts in place,
    here into another buffer so the stored ciphertext stays for the next pass). Each timed pass
    handles ``total_mib`` of records; the median of ``repeats`` passes.
    """
    sealer = bench_sealer()
    rows, raw = [], {}
    for block in BLOCK_SIZES:
        count = max(4, (total_mib << 20) // block)
        seal_s, open_s = _seal_open_seconds(sealer, block, count, repeats)
        total = count * block
        rows.append(
            [
                f"{block / (1 << 20):.2f} MiB",
                gbps(total, seal_s),
                gbps(total, open_s),
                f"{median(seal_s) / count * 1e3:.2f}",
                f"{median(open_s) / count * 1e3:.2f}",
            ]
        )
        raw[f"seal @ {block}"] = seal_s
        raw[f"open @ {block}"] = open_s
    header = [
        "record",
        "seal GB/s, one core",
        "open GB/s, one core",
        "seal ms per record",
        "open ms per record",
    ]
    return markdown_table(header, rows), {"bytes_per_pass": total_mib << 20, **raw}


def _seal_open_seconds(
    sealer: RecordSealer, block: int, count: int, repeats: int
) -> tuple[list[float], list[float]]:
    """Seconds per pass of ``count`` seals, and of ``count`` opens, of one ``block`` record."""
    digest = namespace(block).digest()
    name = sealer.name(digest, bytes(36))
    payload, out, stored = aligned(block, os.urandom(4096)), aligned(block), aligned(block)
    header, ciphertext = sealer.seal(digest, name, payload)
    stored[:] = ciphertext
    # The ciphertext is a view of the sealer's per-thread buffer, which the next, larger seal
    # replaces: a live view would stop it (BufferError).
    ciphertext.release()

    def seal_all() -> None:
        for _ in range(count):
            sealer.seal(digest, name, payload)

    def open_all() -> None:
        for _ in range(count):
            sealer.open(header, stored, out)

    sealer.open(header, stored, out)  # first touch of ``out``'s pages, untimed
    seal_s, open_s = repeat_s(seal_all, repeats), repeat_s(open_all, repeats)
    if bytes(out) != bytes(payload):
        raise RuntimeError("open did not give back the sealed payload")
    return seal_s, open_s


def cold_read_ab(work: Path, total_mib: int, rounds: int) -> str:
    """O_DIRECT vs buffered cold reads of the same records, interleaved round by round, by one
    thread and by as many threads as the engine's disk tier uses by default, with the CPUs
    idle and with every CPU kept busy by a spinning process (as an engine computing is)."""
    rows = []
    for busy in (False, True):
        with _cpus_busy(busy):
            rows += _cold_read_rows(work, total_mib, rounds, "every CPU busy" if busy else "idle")
    header = ["CPUs", "block", "threads", "O_DIRECT cold GB/s", "buffered cold GB/s"]
    return markdown_table(header, rows) + f"\n\nmedian of {rounds} interleaved rounds"


@contextmanager
def _cpus_busy(busy: bool) -> Iterator[None]:
    """One spinning process per CPU while the block runs (if ``busy``)."""
    with busy_thread.spinning_processes(usable_cpus() if busy else 0):
        yield


def _cold_read_rows(work: Path, total_mib: int, rounds: int, cpus: str) -> list[list[str]]:
    rows = []
    for block in BLOCK_SIZES:
        count = max(4, (total_mib << 20) // block)
        folder = work / f"ab-{block}"
        capacity = capacity_for(count, block)
        stores = {
            "O_DIRECT": DiskStore(folder, namespace(block), capacity, 0, io=RecordIO()),
            "buffered": DiskStore(
                folder,
                namespace(block),
                capacity,
                0,
                io=RecordIO(reader=default_reader(direct_reads=False)),
            ),
        }
        payload = aligned(block, os.urandom(4096))
        keys = [i.to_bytes(36, "big") for i in range(count)]
        for key in keys:
            stores["O_DIRECT"].put(key, payload)
        stores["buffered"].refresh()
        cases = [(name, n) for n in (1, AB_THREADS) for name in stores]
        seconds: dict[tuple[str, int], list[float]] = {case: [] for case in cases}
        for r in range(rounds):
            for name, n in cases[:: 1 if r % 2 == 0 else -1]:
                if not drop_page_cache():
                    return [[cpus, "(skipped: drop_caches not permitted)", "", "", ""]]
                seconds[(name, n)].append(drive(stores[name], keys, payload, "get", n))
        for store in stores.values():
            store.close()
        shutil.rmtree(folder)
        rate = {c: count * block / median(v) / 1e9 for c, v in seconds.items()}
        for n in (1, AB_THREADS):
            rows.append(
                [
                    cpus,
                    f"{block / (1 << 20):.2f} MiB",
                    str(n),
                    f"{rate[('O_DIRECT', n)]:.2f}",
                    f"{rate[('buffered', n)]:.2f}",
                ]
            )
    return rows


def drive(store: DiskStore, keys: list[bytes], payload: memoryview, op: str, n: int) -> float:
    """Seconds for ``n`` threads to put (or get) every key, each thread a slice of them."""

    def run(part: list[bytes]) -> None:
        out = aligned(payload.nbytes)
        for key in part:
            if not (store.put(key, payload) if op == "put" else store.get_into(key, out)):
                raise RuntimeError(f"{op} failed")

    workers = [threading.Thread(target=run, args=(keys[i::n],)) for i in range(n)]
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return time.perf_counter() - start


def threads(work: Path, total_mib: int) -> str:
    block = BLOCK_SIZES[0]
    count = (total_mib << 20) // block
    rows = []
    for n_threads in (1, 4):
        folder = work / f"threads-{n_threads}"
        store = DiskStore(
            folder, namespace(block), capacity_for(count, block), free_space_floor_bytes=0
        )
        payload = aligned(block, os.urandom(4096))
        keys = [i.to_bytes(36, "big") for i in range(count)]

        times = {op: drive(store, keys, payload, op, n_threads) for op in ("put", "get")}
        store.close()
        shutil.rmtree(folder)
        rows.append(
            [
                n_threads,
                f"{count * block / times['put'] / 1e9:.2f}",
                f"{count * block / times['get'] / 1e9:.2f}",
            ]
        )
    return markdown_table(["threads", "put GB/s", "get GB/s (warm)"], rows)


def seed_index(folder: Path, records: int, block: int) -> None:
    """Bulk-insert ready rows (no files), as a store with ``records`` records would hold."""
    store = DiskStore(folder, namespace(block), 1 << 50, free_space_floor_bytes=0)
    db = folder / "index.sqlite3"  # one index per folder (schema 2), rows keyed by namespace
    ns = namespace(block).digest_hex()
    store.close()
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(
        "INSERT INTO records(ns, key, state, record_bytes, access_ns, session) "
        "VALUES (?, ?, 1, ?, ?, 'seed')",
        ((ns, i.to_bytes(36, "big"), HEADER_BYTES + block, i) for i in range(records)),
    )
    conn.execute("COMMIT")
    conn.close()


def index_figures(work: Path, records: int, real_records: int) -> str:
    rows = []
    block = 64
    folder = work / "seeded"
    seed_index(folder, records, block)
    opens = [
        timed(
            lambda: DiskStore(folder, namespace(block), 1 << 50, free_space_floor_bytes=0).close()
        )
        for _ in range(3)
    ]
    store = DiskStore(folder, namespace(block), 1 << 50, free_space_floor_bytes=0)
    lookups = [i.to_bytes(36, "big") for i in range(0, 2 * records, 2)]
    latencies = []
    for key in lookups:
        start = time.perf_counter_ns()
        store.contains(key)
        latencies.append(time.perf_counter_ns() - start)
    store.close()
    shutil.rmtree(folder)
    rows.append(
        [
            f"{records:,} (bulk-seeded index)",
            f"{median(opens):.3f}",
            p50_p99(latencies, digits=0),
            "n/a",
        ]
    )
    folder = work / "real"
    store = DiskStore(folder, namespace(block), 1 << 50, free_space_floor_bytes=0)
    payload = os.urandom(block)
    put_s = timed(lambda: [store.put(i.to_bytes(36, "big"), payload) for i in range(real_records)])
    store.close()
    opens = [
        timed(
            lambda: DiskStore(folder, namespace(block), 1 << 50, free_space_floor_bytes=0).close()
        )
        for _ in range(3)
    ]
    shutil.rmtree(folder)
    rows.append(
        [
            f"{real_records:,} (real puts of {block} B)",
            f"{median(opens):.3f}",
            "-",
            f"{real_records / put_s:,.0f}",
        ]
    )
    header = [
        "records indexed",
        "open() s (median of 3)",
        "contains() ns p50 / p99",
        "puts/s while filling",
    ]
    return markdown_table(header, rows)


def run(
    folder: Path | None = None,
    total_mib: int = 192,
    repeats: int = 3,
    open_records: int = 100_000,
    real_records: int = 5_000,
    cold: bool = True,
    json_path: Path | None = None,
    read_ab_only: bool = False,
    emit: Callable[[str], None] = print,
    sealed_only: bool = False,
) -> None:
    """Every table (or only the read A/B, or only the sealing figures), each passed to
    ``emit`` as soon as it is measured.

    Works under a temporary folder in ``folder`` (default: TMPDIR), removed at the end.
    """
    work = Path(tempfile.mkdtemp(prefix="kvtier-bench-", dir=folder))
    try:
        if read_ab_only:
            emit(cold_read_ab(work, total_mib, 2 * repeats + 1))
            emit(f"{total_mib} MiB per pass; {environment_line()}")
            return
        if sealed_only:
            seal_table, seal_raw = seal_rates(total_mib, repeats)
            emit(seal_table + "\n")
            cases = (PLAIN_CASE, SEALED_CASE, SEALED_TENANTS_CASE)
            table, raw = throughput(work, total_mib, repeats, cold, cases)
            emit(table + "\n")
            emit(f"{total_mib} MiB per pass, {repeats} passes; {environment_line()}")
            if json_path is not None:
                json_path.write_text(json.dumps({"sealing": seal_raw, **raw}))
            return
        table, raw = throughput(work, total_mib, repeats, cold)
        emit(table + "\n")
        seal_table, raw["sealing"] = seal_rates(total_mib, repeats)
        emit(seal_table + "\n")
        if cold:
            emit(cold_read_ab(work, total_mib, 2 * repeats + 1) + "\n")
        emit(threads(work, total_mib) + "\n")
        emit(index_figures(work, open_records, real_records) + "\n")
        emit(f"{total_mib} MiB per pass, {repeats} passes; {environment_line()}")
        if json_path is not None:
            json_path.write_text(json.dumps(raw))
    finally:
        shutil.rmtree(work, ignore_errors=True)
