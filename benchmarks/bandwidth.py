"""Restore bandwidth of kvtier's data path next to the machine's physical limits.

No engine: the same code paths an engine uses, on a realistic layout (SmolLM2-135M fp32: 30 KV
tensors, 196,608-byte pages, 128-token blocks of 5,898,240 bytes; 62 blocks = 7,936 tokens):

* disk -> host pool: ``DiskStore.get_into`` of every block into its host-pool row on as many
  threads as the disk tier uses by default, page cache cold (dropped, root only) and warm; and
  cold again the way the disk tier really loads (``load_abandonably``: into the thread's bounce
  buffer, then copied into the row once claimed), side by side: what the guarantee that an
  abandoned load never writes its row costs;
* host pool -> engine KV: ``CpuOffloadingWorker`` copy plan executed as the copy engine does
  (split over the usable CPUs) and on one thread;
* references on the same bytes: one plain sequential read of a file holding them (cold and warm,
  1 MiB reads), a memcpy of the same pages on one thread, and one contiguous memcpy on one
  thread and split over the same CPUs as the copy plan.

Run: ``python -m benchmarks bandwidth --out bench-out``.
"""

import mmap
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from kvtier.bench.report import (
    drop_page_cache,
    environment_line,
    markdown_table,
    median,
    median_range,
)
from kvtier.dataplane.abandonable import AbandonableLoad, BounceBuffers, load_abandonably
from kvtier.dataplane.copy_engine import MAX_SPLIT, memmove_all, run_plan
from kvtier.dataplane.host_layout import CopyPlan, CopyRef, TensorPlacement, plan_copies
from kvtier.format import Namespace
from kvtier.format.record import HEADER_BYTES
from kvtier.native import copier_name
from kvtier.store import DiskStore
from kvtier.threads import usable_cpus

LAYERS, PAGE, BLOCKS = 30, 196_608, 62
ROW = LAYERS * PAGE
#: The disk tier's default ``disk_threads``.
TIER_THREADS = 4


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def _glibc_split(plan: CopyPlan, helpers: ThreadPoolExecutor) -> None:
    """Each copy of ``plan`` with glibc's memmove on its own thread (the calling one last)."""
    copies = [
        ([int(d)], [int(s)], [int(n)])
        for d, s, n in zip(plan.dst, plan.src, plan.sizes, strict=True)
    ]
    futures = [helpers.submit(memmove_all, *copy) for copy in copies[1:]]
    memmove_all(*copies[0])
    for future in futures:
        future.result()


def _even_plan(src: int, dst: int, total: int, pieces: int) -> CopyPlan:
    """``total`` contiguous bytes from ``src`` to ``dst`` as ``pieces`` equal copies."""
    size = total // pieces
    offsets = np.arange(pieces, dtype=np.uint64) * np.uint64(size)
    sizes = np.full(pieces, size, dtype=np.uint64)
    sizes[-1] += np.uint64(total - size * pieces)
    return CopyPlan(np.uint64(src) + offsets, np.uint64(dst) + offsets, sizes)


def run(
    out: Path, reps: int = 3, folder: Path | None = None, progress: Callable[[str], None] = print
) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="kvtier-bw-", dir=folder or out))
    total = BLOCKS * ROW
    host_map = mmap.mmap(-1, BLOCKS * ROW)
    host = np.frombuffer(host_map, dtype=np.int8).reshape(BLOCKS, ROW)
    host[:] = np.random.default_rng(0).integers(-128, 127, host.shape, dtype=np.int8)
    flat = memoryview(host_map)
    namespace = Namespace(
        model="bench",
        weights_fingerprint="",
        kv_dtype="float32",
        block_size_tokens=128,
        num_groups=1,
        num_layers=LAYERS,
        num_kv_heads=3,
        head_size=64,
        block_bytes=ROW,
        hash_algorithm="bench",
    )
    store = DiskStore(work / "tier", namespace, capacity_bytes=2 * total + 2**30)
    keys = [i.to_bytes(4, "big") * 9 for i in range(BLOCKS)]
    for i, key in enumerate(keys):
        if not store.put(key, flat[i * ROW : (i + 1) * ROW]):
            raise RuntimeError("could not store a benchmark block")
    plain = work / "plain.bin"
    with open(plain, "wb") as f:
        f.write(host.tobytes())
        os.fsync(f.fileno())

    results: dict[str, list[float]] = {
        k: []
        for k in (
            "tier_read_cold",
            "tier_read_bounce_cold",
            "tier_read_warm",
            "plain_read_cold",
            "plain_read_warm",
            "record_files_cold",
            "host_to_engine",
            "host_to_engine_1",
            "host_to_engine_memmove",
            "memcpy",
            "memcpy_split",
        )
    }
    dropped = True

    def load(i: int) -> None:
        if not store.get_into(keys[i], flat[i * ROW : (i + 1) * ROW]):
            raise RuntimeError("benchmark block failed to load")

    bounce = BounceBuffers(ROW)

    def load_via_bounce(i: int) -> None:
        row = flat[i * ROW : (i + 1) * ROW]
        read = lambda out: store.get_into(keys[i], out)  # noqa: E731
        if not load_abandonably(AbandonableLoad(), read, bounce.get(), row):
            raise RuntimeError("benchmark block failed to load")

    def tier_read(one: Callable[[int], None] = load) -> float:
        start = time.perf_counter()
        with ThreadPoolExecutor(TIER_THREADS) as readers:
            list(readers.map(one, range(BLOCKS)))
        return time.perf_counter() - start

    def record_files_read() -> float:
        # The record files themselves, one after another, 1 MiB reads, no checks: what the
        # one-file-per-block layout costs before any of kvtier's work.
        paths = [store.record_path(key) for key in keys]
        start = time.perf_counter()
        for i, path in enumerate(paths):
            assert path is not None
            with open(path, "rb", buffering=0) as f:
                f.seek(HEADER_BYTES)
                for offset in range(i * ROW, (i + 1) * ROW, 1 << 20):
                    f.readinto(flat[offset : min(offset + (1 << 20), (i + 1) * ROW)])
        return time.perf_counter() - start

    def plain_read() -> float:
        # Into the host pool, 1 MiB at a time: the same destination the tier fills (a small
        # reused buffer would stay in the CPU cache and flatter the reference).
        start = time.perf_counter()
        with open(plain, "rb", buffering=0) as f:
            for offset in range(0, total, 1 << 20):
                f.readinto(flat[offset : offset + (1 << 20)])
        return time.perf_counter() - start

    engine = [np.zeros((BLOCKS + 8, PAGE), dtype=np.int8) for _ in range(LAYERS)]
    placements = [
        TensorPlacement(t.ctypes.data, PAGE, host.ctypes.data + layer * PAGE, ROW, PAGE)
        for layer, t in enumerate(engine)
    ]
    plan = plan_copies(
        placements,
        [[CopyRef(i, PAGE) for i in range(LAYERS)]],
        1,
        np.arange(8, BLOCKS + 8, dtype=np.int32),
        [BLOCKS],
        [0],
        np.arange(BLOCKS, dtype=np.int32),
        to_host=False,
    )
    target = np.ones_like(host)
    parts = min(usable_cpus(), MAX_SPLIT)
    helpers = ThreadPoolExecutor(max(1, parts - 1))
    memmove_lists = (plan.dst.tolist(), plan.src.tolist(), plan.sizes.tolist())
    split = _even_plan(host.ctypes.data, target.ctypes.data, total, parts)

    def timed_gbps(fn: Callable[[], None], nbytes: int) -> float:
        start = time.perf_counter()
        fn()
        return _gbps(nbytes, time.perf_counter() - start)

    for rep in range(reps):
        # Direct and bounced cold reads alternate which goes first.
        for kind in ("tier_read_cold", "tier_read_bounce_cold")[:: 1 if rep % 2 else -1]:
            dropped &= drop_page_cache()
            one = load if kind == "tier_read_cold" else load_via_bounce
            results[kind].append(_gbps(total, tier_read(one)))
        results["tier_read_warm"].append(_gbps(total, tier_read()))
        dropped &= drop_page_cache()
        results["plain_read_cold"].append(_gbps(total, plain_read()))
        results["plain_read_warm"].append(_gbps(total, plain_read()))
        dropped &= drop_page_cache()
        results["record_files_cold"].append(_gbps(total, record_files_read()))
        n = plan.total_bytes
        results["host_to_engine"].append(timed_gbps(lambda: run_plan(plan, helpers, parts), n))
        results["host_to_engine_1"].append(timed_gbps(lambda: run_plan(plan), n))
        results["host_to_engine_memmove"].append(timed_gbps(lambda: memmove_all(*memmove_lists), n))
        results["memcpy"].append(timed_gbps(lambda: np.copyto(target, host), total))
        results["memcpy_split"].append(timed_gbps(lambda: _glibc_split(split, helpers), total))
        progress(
            f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} GB/s" for k, v in results.items())
        )
    for layer, t in enumerate(engine):
        if not np.array_equal(t[8:], host[:, layer * PAGE : (layer + 1) * PAGE]):
            raise RuntimeError("host -> engine copy moved the wrong bytes")
    store.close()
    helpers.shutdown()
    shutil.rmtree(work, ignore_errors=True)
    med = {k: median(v) for k, v in results.items()}
    copier = copier_name()

    def spread(key: str) -> str:
        return median_range(results[key], digits=2)

    rows = [
        [
            "disk tier -> host pool, page cache cold",
            spread("tier_read_cold"),
            "plain sequential read, cold",
            spread("plain_read_cold"),
            f"{med['tier_read_cold'] / med['plain_read_cold']:.2f}",
        ],
        [
            "disk tier -> host pool, page cache cold",
            spread("tier_read_cold"),
            "plain sequential read of the record files, cold",
            spread("record_files_cold"),
            f"{med['tier_read_cold'] / med['record_files_cold']:.2f}",
        ],
        [
            "disk tier -> host pool as the tier loads (bounce buffer, then claimed copy), cold",
            spread("tier_read_bounce_cold"),
            "disk tier -> host pool, straight into the row, cold",
            spread("tier_read_cold"),
            f"{med['tier_read_bounce_cold'] / med['tier_read_cold']:.2f}",
        ],
        [
            "disk tier -> host pool, second pass",
            spread("tier_read_warm"),
            "plain sequential read, page cache warm",
            spread("plain_read_warm"),
            f"{med['tier_read_warm'] / med['plain_read_warm']:.2f}",
        ],
        [
            f"host pool -> engine KV, copy plan as the engine runs it ({parts} threads, {copier})",
            spread("host_to_engine"),
            f"one contiguous memcpy split over {parts} threads",
            spread("memcpy_split"),
            f"{med['host_to_engine'] / med['memcpy_split']:.2f}",
        ],
        [
            f"host pool -> engine KV, copy plan on 1 thread ({copier})",
            spread("host_to_engine_1"),
            "one contiguous memcpy (numpy), 1 thread",
            spread("memcpy"),
            f"{med['host_to_engine_1'] / med['memcpy']:.2f}",
        ],
        [
            "host pool -> engine KV, copy plan on 1 thread (memmove per page, the fallback)",
            spread("host_to_engine_memmove"),
            "one contiguous memcpy (numpy), 1 thread",
            spread("memcpy"),
            f"{med['host_to_engine_memmove'] / med['memcpy']:.2f}",
        ],
    ]
    markdown = markdown_table(
        [
            "kvtier path",
            "GB/s median (min–max)",
            "reference",
            "GB/s median (min–max)",
            "ratio of medians",
        ],
        rows,
    )
    markdown += (
        f"\n\n{BLOCKS} blocks x {ROW:,} B = {total / 1e6:.0f} MB per pass, medians of "
        f"{reps} passes; page cache dropped: {dropped}; disk tier read on {TIER_THREADS} threads "
        f"(its default), plain read on one. {environment_line()}"
    )
    (out / "bandwidth.md").write_text(markdown + "\n")
    import json

    raw = {"gbps": results, "dropped": dropped, "copier": copier}
    (out / "bandwidth.json").write_text(json.dumps(raw))
    return raw
