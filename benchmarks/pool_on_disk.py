"""Measure what a host pool costs: RAM (``/dev/shm``) against a sparse file (``host_pool_dir``).

Starts one in-process engine per pool kind (tiny Llama, fp32: 256 KiB per 128-token row), fills
the pool with ``--prompts`` distinct prompts, restores one of them from the pool, and reports
per kind: MemAvailable before the engine, after start-up and after the fill; the pool file's
size and allocated bytes; the restore's wall time. Prints JSON.

Run (docs/host-pool-on-disk.md): ``python -m benchmarks pool-on-disk --dir /var/tmp/pool --out
pool.json`` (vLLM logs to stdout; the report is the last JSON printed).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from kvtier.bench.harness.inprocess import InProcessEngine
from kvtier.bench.prompts import random_prompt
from kvtier.bench.report import median, summarize
from tests.support.matrix import SOURCES, case_config, mem_available, pool_files
from tests.support.models import tiny_model

PROMPT_TOKENS = 1024
RESTORES = 7


def _prompt(seed: int) -> list[int]:
    return random_prompt(seed, PROMPT_TOKENS)


def _pool_rss() -> int:
    """Resident bytes of the host-pool mapping (the largest of this process's mappings of it)."""
    return max(
        (
            m.rss
            for m in psutil.Process().memory_maps(grouped=False)
            if "kvtier_pool_" in m.path or "vllm_offload_" in m.path
        ),
        default=0,
    )


def measure(kind: str, pool: str, folder: Path | None, prompts: int) -> dict[str, Any]:
    disk_dir = Path(tempfile.mkdtemp(prefix="kvtier-measure-disk-"))
    options: dict[str, Any] = {"host_pool": pool}
    if folder is not None:
        options["host_pool_dir"] = str(folder)
    case = {"model": str(tiny_model("llama")), "disk_dir": str(disk_dir), "kvtier": options}
    before = mem_available()
    engine = InProcessEngine(case_config(case, kvtier_on=True))
    try:
        after_start = mem_available()
        for seed in range(prompts):
            engine.generate_one(_prompt(seed), 1)
        after_fill = mem_available()
        pool_rss = _pool_rss()
        restore_s, from_host = [], 0.0
        for seed in range(RESTORES):
            engine.reset_prefix_cache()  # the engine forgets; the pool keeps
            started = time.perf_counter()
            from_host += engine.measured(_prompt(seed), 1, SOURCES)[1]["from_host"]
            restore_s.append(time.perf_counter() - started)
        files = pool_files()
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
        "restore_s_median": median(restore_s),
        "restore_s_summary": summarize(restore_s).as_dict(),
        "restore_s": restore_s,
    }


def run(folder: Path, disk_pool: str, ram_pool: str, prompts: int) -> list[dict[str, Any]]:
    """Both pool kinds, RAM first; one report dict each.

    Engines run in this process: vLLM's multiprocessing is switched off here when the caller
    did not (it must be before vLLM reads it, at the first engine).
    """
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    folder.mkdir(parents=True, exist_ok=True)
    return [
        measure("ram", ram_pool, None, prompts),
        measure("disk", disk_pool, folder, prompts),
    ]


def write(report: list[dict[str, Any]], out: Path | None) -> str:
    """The report as JSON text, also written to ``out`` when given."""
    text = json.dumps(report, indent=1)
    if out is not None:
        out.write_text(text)
    return text
