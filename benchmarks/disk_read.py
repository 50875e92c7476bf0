"""kvtier's disk read path against a plain multi-threaded ``O_DIRECT`` read of the same files.

No engine and no vLLM: the disk store alone, so it runs wherever kvtier's core imports (the CPU
machine, or the GPU host with the offline bundle's kvtier piece). It writes ``blocks`` records of
``record_bytes`` each (the H200's Llama-3-8B shape: 16 tokens x 128 KiB = 2 MiB) and then, with
the page cache dropped before every pass, reads them all into rows of one page-aligned host
buffer (page-locked with ``cudaHostRegister`` when torch sees a GPU, as vLLM's CPU pool is;
on huge pages where the kernel gives them) three ways, each on several thread counts:

* ``plain``: each record file opened ``O_DIRECT`` and its payload read with one ``preadv``
  straight into its row, no checks: the reference, what the machine gives these files;
* ``store``: ``DiskStore.get_into`` straight into the row (opens, checks, reads, checksum);
* ``tier``: ``DiskStore.get_into_when`` through a per-thread bounce buffer and a claimed copy
  into the row, exactly as the disk tier loads a block (see ``kvtier.dataplane.abandonable``);
* ``tier-py-claim``: ``tier`` with a plain Python function as the load's claim, so the native
  reader cannot claim inside its read: two GIL-free calls per record with the claim between
  them, where ``tier``'s ``AbandonableLoad`` needs one (it matters beside a busy Python
  thread);
* ``tier-batch``: ``tier`` with each thread's share of the records loaded in one
  ``DiskStore.get_many_into_when`` call (one native call, one GIL hand-over for the share), as
  the disk tier loads a job's blocks;
* ``reader``: the native call that ``tier`` makes for each record
  (``NativeRecordReader.read_claiming``: open, probe, claim, read, hash, copy), called alone: no
  index lookup, header check or counters. Side by side with ``tier`` it splits a record's cost
  between the reader and the store's Python steps around it (which hold the GIL);
* ``store-py`` and ``tier-py``: the same two read by the Python steps instead of the native
  record reader (``RecordReader``: open, checks, read and checksum as separate Python calls),
  when the reader is built; the side-by-side shows what reading a block in one GIL-free call
  gives.

With ``busy_python_thread`` a thread runs Python without pause beside the readers, as an
engine's scheduler loop does. The kinds alternate their order from pass to pass. It prints
GB/s medians per kind and thread count, and each kvtier kind's best against plain's best
(the target: kvtier disk -> pinned host at least 0.8 of a plain multi-threaded
``O_DIRECT`` read). Every row is compared with what was written, so a fast wrong read cannot pass.

With ``page_cache="warm"`` the records are instead made resident in the page cache before
every pass (read once buffered, then checked with ``kvtier.native.resident``, the native
reader's own probe), and the reference is what memory gives:

* ``memcpy``: the same bytes copied from a resident source buffer of the same size into the
  same rows, one ``memcpy`` per record on the same threads: the ceiling;
* ``buffered``: each file read with one plain buffered ``preadv`` into its row, no checks;
* ``tier-odirect``: ``tier`` with the page-cache probe off (``NativeRecordReader(
  page_cache_reads=False)``), reading every record ``O_DIRECT`` as if the page cache held nothing;

beside ``plain``, ``store`` and ``tier`` (the target: the tier's path at least 0.8 of the
memcpy). The count of page-cache hits shows which way kvtier's reads went.

Run: ``python -m benchmarks disk-read --dir /var/tmp --out bench-out`` (add
``--page-cache warm`` for resident records; ``--kinds tier-batch,reader`` measures only those
kvtier kinds, beside the references).
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks import busy_thread
from benchmarks.store_bench import namespace
from kvtier import native
from kvtier.bench.report import drop_page_cache, environment_line, markdown_table, median
from kvtier.buffers import address_of
from kvtier.dataplane.abandonable import AbandonableLoad, BounceBuffers
from kvtier.format.record import HEADER_BYTES
from kvtier.store import DiskStore, NativeRecordReader, RecordIO, RecordReader, default_reader
from kvtier.store.base import FixedClaim


def _pin(buffer: mmap.mmap) -> str:
    """Page-lock ``buffer``: for the GPU when torch sees one, else with ``mlock`` (so a machine
    without a GPU copies into resident, locked pages too); says what was done."""
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        result = torch.cuda.cudart().cudaHostRegister(address_of(buffer), len(buffer), 0)
        return "page-locked (cudaHostRegister)" if int(result) == 0 else f"pageable ({result})"
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mlock(ctypes.c_void_p(address_of(buffer)), ctypes.c_size_t(len(buffer))) == 0:
        return "page-locked (mlock; no GPU)"
    return f"pageable (no GPU; mlock: {os.strerror(ctypes.get_errno())})"


def _read_payload(path: Path, row: memoryview, flags: int = 0) -> None:
    """The record's payload into ``row`` with plain ``preadv`` calls (``flags``: O_DIRECT)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        done = 0
        while done < row.nbytes:
            n = os.preadv(fd, [row[done:]], HEADER_BYTES + done)
            if n <= 0:
                raise RuntimeError(f"short read of {path}")
            done += n
    finally:
        os.close(fd)


def _plain_read(path: Path, row: memoryview) -> None:
    _read_payload(path, row, os.O_DIRECT)


def _buffered_read(path: Path, row: memoryview) -> None:
    _read_payload(path, row)


def _make_resident(paths: list[Path], scratch: memoryview) -> bool:
    """Read every record file once buffered; True when the page cache then holds them all."""
    for path in paths:
        with path.open("rb", buffering=0) as f:
            while f.readinto(scratch):
                pass
    return all(native.resident(path) for path in paths)


class UnknownKinds(ValueError):
    """``only`` names a kind this build does not measure."""


def run(
    out: Path,
    folder: Path | None = None,
    record_bytes: int = 2 << 20,
    blocks: int = 1024,
    threads: tuple[int, ...] = (4, 8, 16, 32),
    passes: int = 3,
    progress: Callable[[str], None] = print,
    busy_python_thread: bool = False,
    page_cache: str = "cold",
    only: tuple[str, ...] | None = None,
) -> dict:
    """``only``: the kvtier kinds to measure (None: every one); the references always run."""
    if page_cache not in ("cold", "warm"):
        raise ValueError(f"page_cache={page_cache!r}; choose cold or warm")
    warm = page_cache == "warm"
    if warm and native.residency_probe() is None:
        raise RuntimeError("--page-cache warm needs the native record reader: build it first")
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvtier-disk-read-", dir=folder))
    host_map = mmap.mmap(-1, blocks * record_bytes)
    # Rows on huge pages where the kernel gives them: an O_DIRECT read into scattered small
    # pages is split into several device requests (as the tier's bounce buffers avoid), and
    # the reference should be the best this machine gives these files.
    host_map.madvise(mmap.MADV_HUGEPAGE)
    pinned = _pin(host_map) + ", huge pages asked (MADV_HUGEPAGE)"
    flat = memoryview(host_map)
    rows = [flat[i * record_bytes : (i + 1) * record_bytes] for i in range(blocks)]
    written = np.random.default_rng(0).integers(0, 255, blocks * record_bytes, dtype=np.uint8)
    total = blocks * record_bytes
    capacity = 2 * total + 2**30
    native_io = default_reader()
    store = DiskStore(
        work / "tier", namespace(record_bytes), capacity, io=RecordIO(reader=native_io)
    )
    keys = [i.to_bytes(4, "big") * 8 for i in range(blocks)]
    source = memoryview(written)
    for i, key in enumerate(keys):
        if not store.put(key, source[i * record_bytes : (i + 1) * record_bytes]):
            raise RuntimeError("could not store a benchmark record")
    paths = [store.record_path(key) for key in keys]
    bounce = BounceBuffers(record_bytes)
    stores = [store]
    # Each kvtier kind: the store it reads from, and how it loads (get_into, or as the tier
    # does with its AbandonableLoad, or with a Python claim).
    loads = {
        "store": (store, "get"),
        "tier": (store, "load"),
        "tier-py-claim": (store, "load-py-claim"),
        "tier-batch": (store, "load-batch"),
    }
    if isinstance(native_io, NativeRecordReader) and native_io.claims_into(rows[0]):
        loads["reader"] = (store, "reader")
    if warm:
        odirect_io = RecordIO(reader=default_reader(page_cache_reads=False))
        odirect = DiskStore(work / "tier", namespace(record_bytes), capacity, io=odirect_io)
        stores.append(odirect)
        loads["tier-odirect"] = (odirect, "load")
    elif native_io.native:
        python_io = RecordIO(reader=RecordReader())
        python_reads = DiskStore(work / "tier", namespace(record_bytes), capacity, io=python_io)
        stores.append(python_reads)
        loads.update({"store-py": (python_reads, "get"), "tier-py": (python_reads, "load")})
    references = ("memcpy", "buffered", "plain") if warm else ("plain",)
    reference = references[0]
    unknown = sorted(set(only or ()) - set(loads))
    if unknown:
        raise UnknownKinds(f"unknown kinds {', '.join(unknown)}; here: {', '.join(loads)}")
    kinds = (*references, *(k for k in loads if only is None or k in only))
    reader = "native one-call reader" if native_io.native else "Python calls (not built)"
    # memcpy's source: the same bytes in resident memory of the same size as the records.
    source_map = mmap.mmap(-1, total) if warm else None
    if source_map is not None:
        source_map[:] = written.tobytes()
    source_at = address_of(source_map) if source_map is not None else 0
    row_at = address_of(host_map)

    reader_hits: list[int] = []

    def share(first: int, end: int) -> None:  # tier-batch: one thread's records in one call
        picked = range(first, end)
        answers = store.get_many_into_when(
            [keys[i] for i in picked],
            [rows[i] for i in picked],
            [AbandonableLoad() for _ in picked],
            bounce.get(),
        )
        if not all(answers):
            raise RuntimeError(f"records {first}..{end - 1} failed to load (tier-batch)")

    def read_all(kind: str, readers: ThreadPoolExecutor, count: int) -> None:
        if kind == "tier-batch":
            step = -(-blocks // count)
            ends = [(j, min(blocks, j + step)) for j in range(0, blocks, step)]
            list(readers.map(lambda span: share(*span), ends))
        else:
            list(readers.map(lambda i: one(kind, i), range(blocks)))

    def one(kind: str, i: int) -> None:
        if kind == "plain":
            _plain_read(paths[i], rows[i])  # type: ignore[arg-type]
            return
        if kind == "buffered":
            _buffered_read(paths[i], rows[i])  # type: ignore[arg-type]
            return
        if kind == "memcpy":
            offset = i * record_bytes
            ctypes.memmove(row_at + offset, source_at + offset, record_bytes)
            return
        using, how = loads[kind]
        if how == "load":
            ok = using.get_into_when(keys[i], rows[i], AbandonableLoad(), bounce.get())
        elif how == "reader":
            assert isinstance(native_io, NativeRecordReader)
            read = native_io.read_claiming(
                paths[i], bounce.get(), rows[i], AbandonableLoad().native_cell, True
            )
            ok = read is not None and read.into is rows[i]
            if ok and read.from_page_cache:
                reader_hits.append(i)  # the store's counters see none of these reads
        elif how == "load-py-claim":
            ok = using.get_into_when(keys[i], rows[i], FixedClaim(), bounce.get())
        else:
            ok = using.get_into(keys[i], rows[i])
        if not ok:
            raise RuntimeError(f"record {i} failed to load ({kind})")

    results: dict[str, dict[int, list[float]]] = {k: {t: [] for t in threads} for k in kinds}
    dropped = True
    host = np.frombuffer(host_map, dtype=np.uint8)
    # One pool per thread count for the whole run, as the tier's threads live as long as it
    # does; an untimed pass first gives each thread its bounce buffer (a first touch of fresh
    # pages the tier pays once per thread, not per load).
    pools = {count: ThreadPoolExecutor(count) for count in threads}
    for readers in pools.values():
        list(readers.map(lambda i: one("tier", i), range(blocks)))
    # An engine's scheduler loop stands in for: a thread running Python without pause, so every
    # reader that gives up the GIL for a system call waits for it to come back.
    with busy_thread.spinning(busy_python_thread):
        scratch = memoryview(bytearray(1 << 20))
        resident = True
        # Timed reads per kvtier kind that came from the page cache.
        from_cache = dict.fromkeys((k for k in loads if k in kinds), 0)
        for n_pass in range(passes):
            order = kinds if n_pass % 2 == 0 else kinds[::-1]
            for count, readers in pools.items():
                for kind in order:
                    host[:] = 0
                    if warm:
                        resident &= _make_resident(paths, scratch)
                    else:
                        dropped &= drop_page_cache()
                    using = loads[kind][0] if kind in loads and kind != "reader" else None
                    hits_before = using.stats().page_cache_hits if using is not None else 0
                    reader_hits.clear()
                    start = time.perf_counter()
                    read_all(kind, readers, count)
                    seconds = time.perf_counter() - start
                    if using is not None:
                        from_cache[kind] += using.stats().page_cache_hits - hits_before
                    elif kind == "reader":
                        from_cache[kind] += len(reader_hits)
                    if not np.array_equal(host, written):
                        raise RuntimeError(f"{kind} on {count} threads read the wrong bytes")
                    results[kind][count].append(total / seconds / 1e9)
                progress(
                    f"pass {n_pass + 1}, {count} threads: "
                    + ", ".join(f"{k} {results[k][count][-1]:.2f} GB/s" for k in kinds)
                )
    for readers in pools.values():
        readers.shutdown()
    for each in stores:
        each.close()
    shutil.rmtree(work, ignore_errors=True)

    med = {k: {t: median(v) for t, v in by_threads.items()} for k, by_threads in results.items()}
    best_reference = max(med[reference].values())
    measured = [k for k in kinds if k != reference]
    table = markdown_table(
        ["threads", *(f"{k} GB/s" for k in kinds), *(f"{k} / {reference}" for k in measured)],
        [
            [
                str(t),
                *(f"{med[k][t]:.2f}" for k in kinds),
                *(f"{med[k][t] / med[reference][t]:.2f}" for k in measured),
            ]
            for t in threads
        ],
    )
    ratio_key = f"ratio_to_best_{reference}"
    summary = {
        k: {"best_gbps": max(med[k].values()), ratio_key: max(med[k].values()) / best_reference}
        for k in measured
    }
    reads = len(threads) * passes * blocks
    if warm:
        state = f"records made resident before each (every record, each time): {resident}"
    else:
        state = f"page cache dropped before each: {dropped}"
    table += (
        f"\n\nbest {reference} {best_reference:.2f} GB/s; "
        + "; ".join(
            f"best {k} {v['best_gbps']:.2f} ({v[ratio_key]:.2f} of {reference})"
            for k, v in summary.items()
        )
        + f". store and tier read with the {reader}; reads from the page cache "
        + ", ".join(f"{k} {n} of {reads}" for k, n in from_cache.items())
        + f" (probe: {native.residency_probe()}). "
        f"{blocks} records x {record_bytes:,} B = {total / 1e9:.2f} GB per pass, medians "
        f"of {passes} passes, {state}; host buffer {pinned}; "
        f"busy Python thread beside the readers: {busy_python_thread}. "
        f"{environment_line()}"
    )
    (out / "disk-read.md").write_text(table + "\n")
    raw = {
        "gbps": results,
        "page_cache": page_cache,
        "dropped": dropped,
        "resident": resident,
        "page_cache_reads": from_cache,
        "pinned": pinned,
        "summary": summary,
    }
    (out / "disk-read.json").write_text(json.dumps(raw))
    return raw
