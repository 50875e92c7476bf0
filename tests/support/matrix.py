"""Run many small engines in one process: the model x KV-dtype matrix and start-up checks.

An engine start in its own process costs ~30-50 s on 2 cores, almost all of it importing torch
and vLLM in the front end, the EngineCore and the worker. With vLLM's multiprocessing off
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, uniprocess executor) the scheduler and the worker live in
this process and a tiny model's engine starts in ~5 s, so one process can run a whole matrix.
Restarts still need a fresh process: phase ``serve`` stores blocks to a disk tier per case,
phase ``restart`` (another process) restores them.

Usage: ``python -m tests.support.matrix PHASE CASES_JSON RESULTS_JSON`` (a runner
the model-matrix test starts, not a user command). Each case is a dict:
``name``, ``model`` (folder), ``dtype``, ``kv_cache_dtype``, ``disk_dir``, ``prompts`` (name ->
token ids), ``max_tokens``, optional ``kvtier`` (extra ``kv_transfer_config`` arguments),
``engine`` (extra engine arguments), ``env`` / ``unset_env`` (environment during the case),
``steps`` (which of ``plain``, ``start``, ``host``, ``disk``, ``store``, ``restore`` to run).
Results: one dict per case, written after every case so a crash keeps what finished. A case
whose engine refuses to start records ``error_stage`` ("plain" or "kvtier") and the error.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import psutil

from kvtier.bench.harness.engine import EngineConfig, GenerateResult
from kvtier.bench.harness.inprocess import InProcessEngine

ENGINE_KV_BYTES = 256 * 2**20
#: Prompt tokens restored per tier (metric deltas a restore is measured by).
SOURCES = {
    "from_host": "vllm:prompt_tokens_cached_by_source{source=host}",
    "from_disk": "vllm:prompt_tokens_cached_by_source{source=disk}",
}


def mem_available() -> int:
    """The kernel's MemAvailable, in bytes."""
    return int(psutil.virtual_memory().available)


def pool_files() -> list[dict[str, Any]]:
    """Host-pool files this process holds open (deleted ones included): size and bytes
    allocated on disk (psutil lists open files but not their allocation: read /proc/self/fd)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "kvtier_pool_" in target or "vllm_offload_" in target:
            st = os.stat(f"/proc/self/fd/{fd}")
            found.append({"path": target, "size": st.st_size, "allocated": st.st_blocks * 512})
    return found


def case_config(case: dict[str, Any], kvtier_on: bool) -> EngineConfig:
    """The in-process engine of a case, with kvtier (host pool, disk tier) or without."""
    import kvtier

    transfer = None
    if kvtier_on:
        options = {
            "host_pool": "384MiB",
            "disk_dir": case["disk_dir"],
            "disk_capacity": "1GiB",
            # restore correctness is under test: every hit is restored (tiny models recompute
            # about as fast as they restore, so the decision may rightly refuse one)
            "restore_decision": False,
            **case.get("kvtier", {}),
        }
        transfer = kvtier.kv_transfer_config(**options)
    return EngineConfig(
        model=case["model"],
        kv_transfer_config=transfer,
        dtype=case.get("dtype", "float32"),
        max_model_len=2048,
        max_num_seqs=4,
        in_process=True,
        extra_args={
            "kv_cache_dtype": case.get("kv_cache_dtype", "auto"),
            "kv_cache_memory_bytes": ENGINE_KV_BYTES,
            **case.get("engine", {}),
        },
    )


def _outcome(result: GenerateResult, sources: dict[str, float] | None = None) -> dict[str, Any]:
    return {
        "token_ids": result.token_ids,
        "num_cached_tokens": result.num_cached_tokens,
        **(sources or {}),
    }


class StartError(Exception):
    """An engine refused to start; the message names which one ("plain" or "kvtier")."""


def _start(case: dict[str, Any], kvtier_on: bool) -> InProcessEngine:
    try:
        return InProcessEngine(case_config(case, kvtier_on))
    except Exception as exc:
        raise StartError("kvtier" if kvtier_on else "plain") from exc


def _restored(engine: InProcessEngine, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """Generate and report where the cached tokens came from (metric deltas)."""
    return _outcome(*engine.measured(prompt, max_tokens, SOURCES))


def _run_case(case: dict[str, Any], phase: str) -> dict[str, Any]:
    prompts: dict[str, list[int]] = case["prompts"]
    max_tokens = case.get("max_tokens", 8)
    steps = case.get("steps", [])
    result: dict[str, Any] = {
        "name": case["name"],
        "phase": phase,
        "mem_available_at_case_start": mem_available(),
    }
    if "plain" in steps:
        plain = _start(case, kvtier_on=False)
        try:
            result["plain"] = {
                name: {
                    "cold": _outcome(plain.generate_one(prompt, max_tokens)[0]),
                    "resume": _outcome(plain.generate_one(prompt, max_tokens)[0]),
                }
                for name, prompt in prompts.items()
            }
            result["plain_start_s"] = plain.start_s
        finally:
            plain.close()
    mem_before = mem_available()
    engine = _start(case, kvtier_on=True)
    result["start_s"] = engine.start_s
    result["kv_groups"] = engine.kv_groups()
    try:
        if "start" in steps:
            result["started"] = {
                "cold": _outcome(engine.generate_one(prompts["host"], max_tokens)[0])
            }
        if "host" in steps:
            cold, _ = engine.generate_one(prompts["host"], max_tokens)
            engine.reset_prefix_cache()
            result["host"] = {
                "cold": _outcome(cold),
                "restored": _restored(engine, prompts["host"], max_tokens),
            }
        if "disk" in steps:
            cold, _ = engine.generate_one(prompts["disk"], max_tokens)
            engine.reset_prefix_cache(reset_connector=True)
            result["disk"] = {
                "cold": _outcome(cold),
                "restored": _restored(engine, prompts["disk"], max_tokens),
            }
        if "store" in steps:
            result["store"] = {
                "cold": _outcome(engine.generate_one(prompts["restart"], max_tokens)[0])
            }
        if "restore" in steps:
            result["restart"] = {"restored": _restored(engine, prompts["restart"], max_tokens)}
        result["pool_files"] = pool_files()
        result["mem_available_drop"] = mem_before - mem_available()
    finally:
        engine.close()
    result["pool_files_after_close"] = pool_files()
    return result


def main() -> None:
    phase, cases_path, results_path = sys.argv[1:4]
    cases = json.loads(Path(cases_path).read_text())
    results: list[dict[str, Any]] = []
    base_env = dict(os.environ)
    for case in cases:
        os.environ.clear()
        os.environ.update(base_env)
        os.environ.update(case.get("env", {}))
        for name in case.get("unset_env", []):
            os.environ.pop(name, None)
        started = time.perf_counter()
        try:
            result = _run_case(case, phase)
        except Exception as exc:  # one case's failure is its result
            root = exc.__cause__ if isinstance(exc, StartError) and exc.__cause__ else exc
            result = {
                "name": case["name"],
                "phase": phase,
                # "plain"/"kvtier": that engine refused to start; "run": failed while serving
                "error_stage": str(exc) if isinstance(exc, StartError) else "run",
                "error": f"{type(root).__name__}: {root}",
                "error_types": [type(e).__name__ for e in _chain(root)],
                "error_messages": [str(e) for e in _chain(root)],
                "traceback": traceback.format_exc(),
            }
        result["wall_s"] = time.perf_counter() - started
        results.append(result)
        Path(results_path).write_text(json.dumps(results, indent=1))
        print(f"matrix: {case['name']} {phase} done in {result['wall_s']:.1f} s", flush=True)
    # Every engine is closed and the results are on disk: skip the interpreter's teardown
    # (torch's finalizers, the final collection: seconds on busy cores, as in the engine child).
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _chain(exc: BaseException) -> list[BaseException]:
    chain = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


if __name__ == "__main__":
    main()
