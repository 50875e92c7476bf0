"""Measure what a host pool costs: RAM (``/dev/shm``) against a sparse file (``host_pool_dir``).

Starts one in-process engine per pool kind (tiny Llama, fp32: 256 KiB per 128-token row), fills
the pool with ``--prompts`` distinct prompts, restores one of them from the pool, and reports
per kind: MemAvailable before the engine, after start-up and after the fill; the pool file's
size and allocated bytes; the restore's wall time. Prints JSON.

Run (docs/host-pool-on-disk.md):
``VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m kvtier.devtools.harness.pool_on_disk --dir /var/tmp/pool
--out pool.json`` (vLLM logs to stdout; the report is the last JSON printed).
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from kvtier.devtools.harness.matrix import _Engine, _mem_available, _pool_files
from kvtier.devtools.models import tiny_model
from kvtier.units import parse_size

PROMPT_TOKENS = 1024
RESTORES = 7
_MAPPING = re.compile(r"^[0-9a-f]+-[0-9a-f]+ ")


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 2048) for _ in range(PROMPT_TOKENS)]


def _pool_rss() -> int:
    """Resident bytes of the host-pool mapping (the largest of this process's mappings of it)."""
    best, current, in_pool = 0, 0, False
    with open("/proc/self/smaps", encoding="utf-8", errors="replace") as smaps:
        for line in smaps:
            if _MAPPING.match(line):  # a mapping's header line; its fields follow
                in_pool = "kvtier_pool_" in line or "vllm_offload_" in line
                current = 0
            elif in_pool and line.startswith("Rss:"):
                current = int(line.split()[1]) * 1024
                best = max(best, current)
    return best


def measure(kind: str, pool: str, folder: Path | None, prompts: int) -> dict[str, Any]:
    disk_dir = Path(tempfile.mkdtemp(prefix="kvtier-measure-disk-"))
    options: dict[str, Any] = {"host_pool": pool}
    if folder is not None:
        options["host_pool_dir"] = str(folder)
    case = {"model": str(tiny_model("llama")), "disk_dir": str(disk_dir), "kvtier": options}
    before = _mem_available()
    engine = _Engine(case, kvtier_on=True)
    try:
        after_start = _mem_available()
        for seed in range(prompts):
            engine.generate(_prompt(seed), 1)
        after_fill = _mem_available()
        pool_rss = _pool_rss()
        restore_s, from_host = [], 0.0
        for seed in range(RESTORES):
            engine.llm.reset_prefix_cache()  # the engine forgets; the pool keeps
            started = time.perf_counter()
            from_host += engine.measured(_prompt(seed), 1)["from_host"]
            restore_s.append(time.perf_counter() - started)
        files = _pool_files()
    finally:
        engine.close()
        shutil.rmtree(disk_dir, ignore_errors=True)
    return {
        "kind": kind,
        "pool": pool,
        "prompts": prompts,
        "stored_bytes": prompts * (PROMPT_TOKENS // 128) * 256 * 1024,
        "mem_available_drop_at_start": before - after_start,
        "mem_available_drop_after_fill": before - after_fill,
        "pool_file": files[0] if files else None,
        "pool_resident_bytes_after_fill": pool_rss,
        "restored_tokens_from_host": from_host,
        "restore_s_median": sorted(restore_s)[len(restore_s) // 2],
        "restore_s": restore_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, required=True, help="folder for the pool file")
    parser.add_argument("--disk-pool", default="32GiB", help="size of the pool on disk")
    parser.add_argument("--ram-pool", default="2GiB", help="size of the pool in /dev/shm")
    parser.add_argument("--prompts", type=int, default=120, help="distinct 1024-token prompts")
    parser.add_argument("--out", type=Path, help="write the JSON report here too")
    args = parser.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    parse_size(args.disk_pool, "--disk-pool")
    report = [
        measure("ram", args.ram_pool, None, args.prompts),
        measure("disk", args.disk_pool, args.dir, args.prompts),
    ]
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
