"""Run many small engines in one process: the model x KV-dtype matrix and start-up checks.

An engine start in its own process costs ~30-50 s on 2 cores, almost all of it importing torch
and vLLM in the front end, the EngineCore and the worker. With vLLM's multiprocessing off
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, uniprocess executor) the scheduler and the worker live in
this process and a tiny model's engine starts in ~5 s, so one process can run a whole matrix.
Restarts still need a fresh process: phase ``serve`` stores blocks to a disk tier per case,
phase ``restart`` (another process) restores them.

Usage: ``python -m kvtier.devtools.harness.matrix PHASE CASES_JSON RESULTS_JSON``. Each case is a dict:
``name``, ``model`` (folder), ``dtype``, ``kv_cache_dtype``, ``disk_dir``, ``prompts`` (name ->
token ids), ``max_tokens``, optional ``kvtier`` (extra ``kv_transfer_config`` arguments),
``engine`` (extra engine arguments), ``env`` / ``unset_env`` (environment during the case),
``steps`` (which of ``plain``, ``start``, ``host``, ``disk``, ``store``, ``restore`` to run).
Results: one dict per case, written after every case so a crash keeps what finished. A case
whose engine refuses to start records ``error_stage`` ("plain" or "kvtier") and the error.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ENGINE_KV_BYTES = 256 * 2**20
FROM_HOST = "vllm:prompt_tokens_cached_by_source{source=host}"
FROM_DISK = "vllm:prompt_tokens_cached_by_source{source=disk}"


def _mem_available() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def _pool_files() -> list[dict[str, Any]]:
    """Host-pool files this process maps (deleted ones included): size and blocks used."""
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


class _Engine:
    """One in-process ``vllm.LLM`` plus the helpers a case needs."""

    def __init__(self, case: dict[str, Any], kvtier_on: bool) -> None:
        from vllm import LLM

        import kvtier

        args: dict[str, Any] = {
            "model": case["model"],
            "dtype": case.get("dtype", "float32"),
            "kv_cache_dtype": case.get("kv_cache_dtype", "auto"),
            "max_model_len": 2048,
            "max_num_seqs": 4,
            "enforce_eager": True,
            "enable_prefix_caching": True,
            "skip_tokenizer_init": True,
            "disable_log_stats": False,
            "seed": 0,
            "kv_cache_memory_bytes": ENGINE_KV_BYTES,
            "distributed_executor_backend": "uni",
            **case.get("engine", {}),
        }
        if kvtier_on:
            options = {
                "host_pool": "384MiB",
                "disk_dir": case["disk_dir"],
                "disk_capacity": "1GiB",
                **case.get("kvtier", {}),
            }
            args["kv_transfer_config"] = kvtier.kv_transfer_config(**options)
        started = time.perf_counter()
        self.llm = LLM(**args)
        self.start_s = time.perf_counter() - started

    def generate(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, seed=0)
        (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
        return {
            "token_ids": list(out.outputs[0].token_ids),
            "num_cached_tokens": out.num_cached_tokens or 0,
        }

    def metrics(self) -> dict[str, float]:
        from kvtier.devtools.harness.child import _metrics

        return _metrics(self.llm)

    def measured(self, prompt: list[int], max_tokens: int) -> dict[str, Any]:
        """Generate and report where the cached tokens came from (metric deltas)."""
        before = self.metrics()
        result = self.generate(prompt, max_tokens)
        after = self.metrics()
        for key, label in ((FROM_HOST, "from_host"), (FROM_DISK, "from_disk")):
            result[label] = after.get(key, 0.0) - before.get(key, 0.0)
        return result

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.llm.llm_engine.engine_core.shutdown()
        del self.llm
        gc.collect()


def _kv_groups(llm: Any) -> list[dict[str, Any]]:
    """The engine's KV cache groups (spec type, layers), when the engine runs in-process."""
    with contextlib.suppress(AttributeError):
        core = llm.llm_engine.engine_core.engine_core
        return [
            {"spec": type(g.kv_cache_spec).__name__, "layers": len(g.layer_names)}
            for g in core.scheduler.kv_cache_config.kv_cache_groups
        ]
    return []


class StartError(Exception):
    """An engine refused to start; the message names which one ("plain" or "kvtier")."""


def _reset_after_failed_start() -> None:
    """Drop what a half-initialised in-process engine left in vLLM's module globals.

    A refused start can leave the worker's KV connector registered (``ensure_kv_transfer_
    initialized`` returns early for every later engine of the process, which then runs with
    the wrong one) and the parallel groups initialised.
    """
    from vllm.distributed import parallel_state
    from vllm.distributed.kv_transfer import kv_transfer_state

    with contextlib.suppress(Exception):
        kv_transfer_state.ensure_kv_transfer_shutdown()
    with contextlib.suppress(Exception):
        parallel_state.destroy_model_parallel()
    with contextlib.suppress(Exception):
        parallel_state.destroy_distributed_environment()
    gc.collect()


def _start(case: dict[str, Any], kvtier_on: bool) -> _Engine:
    try:
        return _Engine(case, kvtier_on)
    except Exception as exc:
        _reset_after_failed_start()
        raise StartError("kvtier" if kvtier_on else "plain") from exc


def _run_case(case: dict[str, Any], phase: str) -> dict[str, Any]:
    prompts: dict[str, list[int]] = case["prompts"]
    max_tokens = case.get("max_tokens", 8)
    steps = case.get("steps", [])
    result: dict[str, Any] = {
        "name": case["name"],
        "phase": phase,
        "mem_available_at_case_start": _mem_available(),
    }
    if "plain" in steps:
        plain = _start(case, kvtier_on=False)
        try:
            result["plain"] = {
                name: {
                    "cold": plain.generate(prompt, max_tokens),
                    "resume": plain.generate(prompt, max_tokens),
                }
                for name, prompt in prompts.items()
            }
            result["plain_start_s"] = plain.start_s
        finally:
            plain.close()
    mem_before = _mem_available()
    engine = _start(case, kvtier_on=True)
    result["start_s"] = engine.start_s
    result["kv_groups"] = _kv_groups(engine.llm)
    try:
        if "start" in steps:
            result["started"] = {"cold": engine.generate(prompts["host"], max_tokens)}
        if "host" in steps:
            cold = engine.generate(prompts["host"], max_tokens)
            engine.llm.reset_prefix_cache()
            result["host"] = {
                "cold": cold,
                "restored": engine.measured(prompts["host"], max_tokens),
            }
        if "disk" in steps:
            cold = engine.generate(prompts["disk"], max_tokens)
            engine.llm.reset_prefix_cache(reset_connector=True)
            result["disk"] = {
                "cold": cold,
                "restored": engine.measured(prompts["disk"], max_tokens),
            }
        if "store" in steps:
            result["store"] = {"cold": engine.generate(prompts["restart"], max_tokens)}
        if "restore" in steps:
            result["restart"] = {"restored": engine.measured(prompts["restart"], max_tokens)}
        result["pool_files"] = _pool_files()
        result["mem_available_drop"] = mem_before - _mem_available()
    finally:
        engine.close()
    result["pool_files_after_close"] = _pool_files()
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


def _chain(exc: BaseException) -> list[BaseException]:
    chain = []
    seen: BaseException | None = exc
    while seen is not None and seen not in chain:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    return chain


if __name__ == "__main__":
    main()
