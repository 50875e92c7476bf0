"""Restore bandwidth of kvtier's data path next to the machine's physical limits.

No engine: the same code paths an engine uses, on a realistic layout (SmolLM2-135M fp32: 30 KV
tensors, 196,608-byte pages, 128-token blocks of 5,898,240 bytes; 62 blocks = 7,936 tokens):

* disk -> host pool: ``DiskStore.get_into`` of every block into its host-pool row (what a
  promotion does), page cache cold (dropped, root only) and warm;
* host pool -> engine KV: ``CpuOffloadingWorker`` copy plan executed by the copy engine;
* references on the same bytes: one plain sequential read of a file holding them (cold and warm,
  1 MiB reads) and a numpy memcpy.

Run: ``kvtier bench bandwidth --out bench-out``.
"""

import mmap
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from kvtier.bench.report import drop_page_cache, environment_line, markdown_table
from kvtier.bench.stats import median
from kvtier.format import Namespace
from kvtier.store import DiskStore
from kvtier.vllm.copy_engine import run_plan
from kvtier.vllm.host_layout import CopyRef, TensorPlacement, plan_copies

LAYERS, PAGE, BLOCKS = 30, 196_608, 62
ROW = LAYERS * PAGE


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


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
            "tier_read_warm",
            "plain_read_cold",
            "plain_read_warm",
            "host_to_engine",
            "memcpy",
        )
    }
    dropped = True

    def tier_read() -> float:
        start = time.perf_counter()
        for i, key in enumerate(keys):
            if not store.get_into(key, flat[i * ROW : (i + 1) * ROW]):
                raise RuntimeError("benchmark block failed to load")
        return time.perf_counter() - start

    def plain_read() -> float:
        buf = bytearray(1 << 20)
        start = time.perf_counter()
        with open(plain, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
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
    target = np.empty_like(host)
    for rep in range(reps):
        dropped &= drop_page_cache()
        results["tier_read_cold"].append(_gbps(total, tier_read()))
        results["tier_read_warm"].append(_gbps(total, tier_read()))
        dropped &= drop_page_cache()
        results["plain_read_cold"].append(_gbps(total, plain_read()))
        results["plain_read_warm"].append(_gbps(total, plain_read()))
        start = time.perf_counter()
        run_plan(plan)
        results["host_to_engine"].append(_gbps(plan.total_bytes, time.perf_counter() - start))
        start = time.perf_counter()
        np.copyto(target, host)
        results["memcpy"].append(_gbps(total, time.perf_counter() - start))
        progress(
            f"rep {rep + 1}: " + ", ".join(f"{k} {v[-1]:.2f} GB/s" for k, v in results.items())
        )
    for layer, t in enumerate(engine):
        if not np.array_equal(t[8:], host[:, layer * PAGE : (layer + 1) * PAGE]):
            raise RuntimeError("host -> engine copy moved the wrong bytes")
    store.close()
    med = {k: median(v) for k, v in results.items()}
    rows = [
        [
            "disk tier -> host pool, page cache cold",
            f"{med['tier_read_cold']:.2f}",
            "plain sequential read, cold",
            f"{med['plain_read_cold']:.2f}",
            f"{med['tier_read_cold'] / med['plain_read_cold']:.2f}",
        ],
        [
            "disk tier -> host pool, second pass",
            f"{med['tier_read_warm']:.2f}",
            "plain sequential read, page cache warm",
            f"{med['plain_read_warm']:.2f}",
            f"{med['tier_read_warm'] / med['plain_read_warm']:.2f}",
        ],
        [
            "host pool -> engine KV (copy plan)",
            f"{med['host_to_engine']:.2f}",
            "numpy memcpy",
            f"{med['memcpy']:.2f}",
            f"{med['host_to_engine'] / med['memcpy']:.2f}",
        ],
    ]
    markdown = markdown_table(["kvtier path", "GB/s", "reference", "GB/s", "ratio"], rows)
    markdown += (
        f"\n\n{BLOCKS} blocks x {ROW:,} B = {total / 1e6:.0f} MB per pass, medians of "
        f"{reps} passes; page cache dropped: {dropped}. {environment_line()}"
    )
    (out / "bandwidth.md").write_text(markdown + "\n")
    import json

    (out / "bandwidth.json").write_text(json.dumps({"gbps": results, "dropped": dropped}))
    return {"gbps": results, "dropped": dropped}
