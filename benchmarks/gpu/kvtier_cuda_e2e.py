"""kvtier on vLLM 0.25.1 (CUDA) end to end on one GPU: store, evict, restore from vLLM's host
pool and from kvtier's disk tier in a fresh process, outputs checked against the prefix-hit
oracle.

Runs on a GPU host where the offline bundle (``build-bundle.sh``) is unpacked into ``site/``::

    PYTHONPATH=$PWD/site python3 kvtier_cuda_e2e.py            # phases a, b, c, each a process

Llama-3-8B shape (32 layers, 8 KV heads x 128, bf16) with dummy weights (only ``config.json``
is needed), FlashAttention 3, eager, as vLLM's own baseline was measured on that machine. TTFT
is the wall time of a ``max_tokens=1`` request; the oracle is the 8 greedy tokens of the same
prompt resumed from the engine's own prefix cache.

* a: cold prefill, engine prefix hit (the oracle), host-pool restore after
  ``reset_prefix_cache``; then waits until kvtier's disk tier holds the prompts' blocks. At its
  shutdown the engine leaves the restore decision's evidence (its timed prefills, its disk
  probes) beside the records (``<disk>/<namespace>/decision.json``).
* b: a fresh process: each prompt restored from the disk tier with the restore decision
  opted out per request (``kvtier_restore_decision: false``), so the disk really is read;
  the output must equal the oracle and the engine must report cached tokens. Its disk loads
  join the folder's evidence.
* c: a fresh process with the decision on, starting from the evidence a and b left: per
  length, the decision's verdict (``kvtier:restore_decisions``; ``unmeasured`` would mean it
  restored unweighed) and its TTFT next to cold (a) and the disk restore (b).
* d (with a shared tier only): a fresh process with an empty disk folder restores every prompt
  from the shared tier (decision opted out), output checked against the oracle.
* e (with ``KVTIER_E2E_PHASES`` naming it): records damaged on disk (one payload byte flipped
  in ``KVTIER_E2E_DAMAGE`` files, default 8), then a fresh process restores every prompt with
  the decision opted out: damaged records must be quarantined misses, outputs the oracle's.

Exit status 1 when an output differs from the oracle, a restore read nothing, or c found no
evidence to start from or decided a request unmeasured. Environment: ``KVTIER_E2E_WORK``
(scratch, default /var/tmp/kvtier-e2e), ``KVTIER_E2E_LENGTHS`` (default 2048,8192,32768),
``KVTIER_E2E_SHAPE`` (``llama-3-8b``, the default, or ``qwen2.5-32b``), ``KVTIER_E2E_DROP=1``
drops the page cache before b and c (root), ``KVTIER_E2E_CALIBRATE=1``
also prefills cold prompts of every length in c before the stored ones (not needed: the
evidence is the earlier processes'), ``KVTIER_E2E_REPS`` (distinct prompts per length, default
1; medians are printed), ``KVTIER_E2E_PHASES`` (default ``abc``), ``KVTIER_E2E_ENCRYPT=1``
(sealed records: AES-256-GCM under a key file made in the scratch folder),
``KVTIER_E2E_REDIS_SERVER`` (a ``redis-server`` binary: a throw-away loopback server becomes the
shared tier of every phase, and phase d runs; its folder is put on ``LD_LIBRARY_PATH`` for it).
"""

from __future__ import annotations

import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

WORK = Path(os.environ.get("KVTIER_E2E_WORK", "/var/tmp/kvtier-e2e"))
LENGTHS = [int(x) for x in os.environ.get("KVTIER_E2E_LENGTHS", "2048,8192,32768").split(",")]
REPS = int(os.environ.get("KVTIER_E2E_REPS", "1"))
ENCRYPT = os.environ.get("KVTIER_E2E_ENCRYPT") == "1"
#: Set by main() for the phases when KVTIER_E2E_REDIS_SERVER names a binary.
SHARED_URL = os.environ.get("KVTIER_E2E_SHARED_URL")
#: vLLM 0.25.1 on that host (docs: the CUDA research notes). PYTHONHASHSEED: kvtier refuses a
#: persistent tier without it there (block hashes would differ in every process).
ENV = {
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    "VLLM_USE_DEEP_GEMM": "0",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",
    "PYTHONHASHSEED": "0",
}
_LLAMA_3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "bfloat16",
}
_QWEN2_5_32B = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 5120,
    "intermediate_size": 27648,
    "num_hidden_layers": 64,
    "num_attention_heads": 40,
    "num_key_value_heads": 8,
    "vocab_size": 152064,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "torch_dtype": "bfloat16",
}
#: Model shapes by ``KVTIER_E2E_SHAPE`` (dummy weights: only the config is needed).
SHAPES = {"llama-3-8b": _LLAMA_3_8B, "qwen2.5-32b": _QWEN2_5_32B}
SHAPE_NAME = os.environ.get("KVTIER_E2E_SHAPE", "llama-3-8b")
SHAPE = SHAPES[SHAPE_NAME]
OFF = {"kvtier_restore_decision": False}


def model_dir() -> str:
    folder = WORK / f"{SHAPE_NAME}-shape"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(SHAPE))
    return str(folder)


def key_file() -> Path:
    """A master key private to this user, made once per scratch folder."""
    path = WORK / "master.key"
    if not path.exists():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(os.urandom(32).hex() + "\n")
    return path


def engine(disk: str = "disk"):  # type: ignore[no-untyped-def]
    from vllm import LLM

    import kvtier

    config = kvtier.kv_transfer_config(
        host_pool="16GiB",
        disk_dir=WORK / disk,
        disk_capacity="64GiB",
        platform="cuda",
        shared=SHARED_URL,
        encryption_key_files=[key_file()] if ENCRYPT else None,
    )
    return LLM(
        model=model_dir(),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        enable_prefix_caching=True,
        dtype="bfloat16",
        max_model_len=max(LENGTHS) + 64,
        gpu_memory_utilization=0.6,
        seed=0,
        attention_backend="FLASH_ATTN",
        max_num_batched_tokens=8192,
        kv_transfer_config=config,
        disable_log_stats=False,  # kvtier's counters reach prometheus_client only with stats
    )


def prompts() -> dict[str, tuple[int, list[int]]]:
    """Distinct prompts by name ("8192" or, with several per length, "8192#1"): (length, ids)."""
    rng = random.Random(7)
    found = {}
    for rep in range(REPS):
        for n in LENGTHS:
            name = str(n) if rep == 0 else f"{n}#{rep}"
            found[name] = (n, [rng.randrange(1000, 120000) for _ in range(n)])
    return found


def medians(by_name: dict[str, float]) -> str:
    """Median per length of figures keyed by prompt name, as one line."""
    per_length: dict[int, list[float]] = {}
    for name, value in by_name.items():
        per_length.setdefault(int(name.split("#")[0]), []).append(value)
    return "  ".join(
        f"{n}: {statistics.median(v):.3f}s (n={len(v)})" for n, v in sorted(per_length.items())
    )


def run(llm, ids: list[int], params: dict | None = None) -> tuple[float, int, list[int]]:  # type: ignore[no-untyped-def]
    """(TTFT s, cached tokens, 8 greedy tokens) of one prompt."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra = None if params is None else {"kv_transfer_params": params}

    def sampling(n: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False, extra_args=extra
        )

    prompt = [TokensPrompt(prompt_token_ids=ids)]
    started = time.perf_counter()
    first = llm.generate(prompt, sampling(1), use_tqdm=False)[0]
    ttft = time.perf_counter() - started
    tokens = llm.generate(prompt, sampling(8), use_tqdm=False)[0]
    return ttft, int(first.num_cached_tokens or 0), list(tokens.outputs[0].token_ids)


def decisions() -> dict[str, float]:
    """kvtier's ``kvtier:restore_decisions`` of the disk tier by verdict, as this process's
    prometheus_client holds them ({} if vLLM did not export them)."""
    from prometheus_client import REGISTRY

    found: dict[str, float] = {}
    for family in REGISTRY.collect():
        if family.name != "kvtier:restore_decisions":
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("tier") == "disk":
                verdict = sample.labels.get("verdict", "?")
                found[verdict] = found.get(verdict, 0.0) + sample.value
    return found


def verdict_of(before: dict[str, float], after: dict[str, float]) -> str:
    """The verdicts counted between two ``decisions()`` (one request: one verdict)."""
    grown = [v for v in sorted(after) if after[v] > before.get(v, 0.0)]
    return "+".join(grown) if grown else "none counted"


def evidence_summary() -> str | None:
    """What the disk folder's decision evidence holds, in words; None if there is none."""
    found = sorted((WORK / "disk").glob("*/decision.json"))
    if not found:
        return None
    parts = []
    for path in found:
        try:
            doc = json.loads(path.read_text())
            loads = {t: len(v) for t, v in doc.get("tier_loads", {}).items()}
            saved = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc["saved_at"]))
            parts.append(
                f"{len(doc['prefill_steps'])} prefill steps, loads {loads}, saved {saved} "
                f"on {doc['device']!r}"
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parts.append(f"{path.name} unreadable here ({exc})")
    return "; ".join(parts)


def disk_bytes() -> int:
    return sum(p.stat().st_size for p in (WORK / "disk").rglob("*") if p.is_file())


def wait_for_disk(timeout_s: float = 120.0) -> int:
    """Until the disk tier's files stop growing (stores cascade from the host pool)."""
    last, stable, deadline = -1, 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline and stable < 3:
        time.sleep(2)
        now = disk_bytes()
        stable = stable + 1 if now == last else 0
        last = now
    return last


def phase_a() -> bool:
    llm = engine()
    run(llm, [5] * 512)
    results, ok = {}, True
    for n, (_, ids) in prompts().items():
        cold = run(llm, ids)
        hit = run(llm, ids)  # the engine's own prefix hit: the oracle
        llm.reset_prefix_cache()
        time.sleep(1)
        pool = run(llm, ids, OFF)
        equal = pool[2] == hit[2]
        ok &= equal and pool[1] > 0
        results[n] = {"cold": cold[0], "hit": hit[0], "host_pool": pool[0], "oracle": hit[2]}
        print(
            f"a {n}: cold {cold[0]:.3f}s  prefix hit {hit[0]:.3f}s  host-pool restore "
            f"{pool[0]:.3f}s [{pool[1]} cached] equal={equal}",
            flush=True,
        )
    held = wait_for_disk()
    print(f"a: disk tier holds {held / 2**30:.2f} GiB", flush=True)
    if SHARED_URL:
        print(f"a: shared tier holds {wait_for_shared() / 2**30:.2f} GiB", flush=True)
    print("a medians: cold " + medians({k: v["cold"] for k, v in results.items()}), flush=True)
    print(
        "a medians: host pool " + medians({k: v["host_pool"] for k, v in results.items()}),
        flush=True,
    )
    (WORK / "a.json").write_text(json.dumps(results))
    return ok and held > 0


def shared_bytes() -> int:
    import redis

    client = redis.Redis.from_url(SHARED_URL)
    try:
        return int(client.info("memory")["used_memory"])
    finally:
        client.close()


def wait_for_shared(timeout_s: float = 180.0) -> int:
    """Until the shared server's memory stops growing (the tier's writes are asynchronous)."""
    last, stable, deadline = -1, 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline and stable < 3:
        time.sleep(2)
        now = shared_bytes()
        stable = stable + 1 if now == last else 0
        last = now
    return last


def drop_page_cache() -> None:
    if os.environ.get("KVTIER_E2E_DROP") == "1":
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        print("page cache dropped", flush=True)


def phase_b() -> bool:
    before = json.loads((WORK / "a.json").read_text())
    drop_page_cache()
    llm = engine()
    run(llm, [5] * 512)
    ok = True
    restored = {}
    for n, (_, ids) in prompts().items():
        ttft, cached, tokens = run(llm, ids, OFF)
        equal = tokens == before[n]["oracle"]
        ok &= equal and cached > 0
        restored[n] = ttft
        print(
            f"b {n}: disk restore (fresh process) {ttft:.3f}s [{cached} cached] equal={equal} "
            f"vs cold {before[n]['cold']:.3f}s",
            flush=True,
        )
    print(
        f"b medians ({'sealed' if ENCRYPT else 'plain'} records): disk restore "
        + medians(restored),
        flush=True,
    )
    (WORK / "b.json").write_text(json.dumps(restored))
    return ok


def phase_c() -> bool:
    before = json.loads((WORK / "a.json").read_text())
    disk = json.loads((WORK / "b.json").read_text()) if (WORK / "b.json").exists() else {}
    evidence = evidence_summary()
    print(f"c: decision evidence in the folder: {evidence or 'none'}", flush=True)
    ok = evidence is not None
    drop_page_cache()
    llm = engine()
    run(llm, [5] * 512)
    if os.environ.get("KVTIER_E2E_CALIBRATE") == "1":
        # Cold prompts of every length first (never stored before): more prefill evidence of
        # this very process, beside what the earlier processes left.
        rng = random.Random(11)
        for n in LENGTHS:
            ttft = run(llm, [rng.randrange(1000, 120000) for _ in range(n)])[0]
            print(f"c calibration {n}: cold {ttft:.3f}s", flush=True)
    for n, (_, ids) in prompts().items():
        counted = decisions()
        ttft, cached, tokens = run(llm, ids)
        verdict = verdict_of(counted, decisions())
        equal = tokens == before[n]["oracle"]
        ok &= equal and "unmeasured" not in verdict
        did = "restored" if cached > 0 else "recomputed"
        cold = before[n]["cold"]
        restore = disk.get(n)
        best = min(cold, restore) if restore is not None else cold
        print(
            f"c {n}: decision {verdict}: {did} {ttft:.3f}s [{cached} cached] equal={equal}; "
            f"cold {cold:.3f}s, disk restore "
            + (f"{restore:.3f}s" if restore is not None else "not run")
            + f", {ttft / best:.2f}x the better of the two",
            flush=True,
        )
    return ok


def phase_d() -> bool:
    """A fresh process with an empty disk folder: every prompt from the shared tier."""
    before = json.loads((WORK / "a.json").read_text())
    llm = engine(disk="disk-d")
    run(llm, [5] * 512)
    ok, restored = True, {}
    for n, (_, ids) in prompts().items():
        ttft, cached, tokens = run(llm, ids, OFF)
        equal = tokens == before[n]["oracle"]
        ok &= equal and cached > 0
        restored[n] = ttft
        print(
            f"d {n}: shared restore (fresh process, empty disk) {ttft:.3f}s [{cached} cached] "
            f"equal={equal} vs cold {before[n]['cold']:.3f}s",
            flush=True,
        )
    print("d medians: shared restore " + medians(restored), flush=True)
    return ok


def phase_e() -> bool:
    """Damaged records under a fresh process: ``KVTIER_E2E_DAMAGE`` record files of the disk
    folder get one payload byte flipped; every prompt is then restored with the decision
    opted out. Each damaged record read must be a quarantined miss, recomputed, and every
    output must still equal the oracle."""
    before = json.loads((WORK / "a.json").read_text())
    records = sorted(p for p in (WORK / "disk").rglob("*.kvb") if "quarantine" not in p.parts)
    count = int(os.environ.get("KVTIER_E2E_DAMAGE", "8"))
    rng = random.Random(3)
    for path in rng.sample(records, min(count, len(records))):
        with open(path, "r+b") as f:  # past the 4 KiB header: a payload byte
            f.seek(4096 + (path.stat().st_size - 4096) // 2)
            byte = f.read(1)
            f.seek(-1, os.SEEK_CUR)
            f.write(bytes([byte[0] ^ 0x40]))
    print(
        f"e: flipped one payload byte in {min(count, len(records))} of {len(records)} records",
        flush=True,
    )
    llm = engine()
    run(llm, [5] * 512)
    ok = True
    for n, (_, ids) in prompts().items():
        ttft, cached, tokens = run(llm, ids, OFF)
        equal = tokens == before[n]["oracle"]
        ok &= equal
        print(
            f"e {n}: restore over damaged records {ttft:.3f}s [{cached} cached] equal={equal} "
            f"vs cold {before[n]['cold']:.3f}s",
            flush=True,
        )
    quarantined = [p for p in (WORK / "disk").rglob("*") if "quarantine" in p.parts and p.is_file()]
    print(f"e: {len(quarantined)} records quarantined", flush=True)
    return ok and len(quarantined) > 0


PHASES = {"a": phase_a, "b": phase_b, "c": phase_c, "d": phase_d, "e": phase_e}


def start_redis(binary: str) -> tuple[subprocess.Popen[bytes], str]:
    """A throw-away loopback server (no persistence) for the shared tier."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "LD_LIBRARY_PATH": str(Path(binary).resolve().parent)}
    argv = [
        binary,
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--save",
        "",
        "--appendonly",
        "no",
        "--protected-mode",
        "yes",
        "--maxmemory",
        "48gb",
        "--maxmemory-policy",
        "allkeys-lru",
        "--proto-max-bulk-len",
        "1gb",
    ]
    server = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return server, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.2)
    server.kill()
    raise RuntimeError(f"{binary} did not listen on port {port}")


def main() -> int:
    WORK.mkdir(parents=True, exist_ok=True)
    if len(sys.argv) > 1:
        return 0 if PHASES[sys.argv[1]]() else 1
    env = {**ENV, **os.environ}
    phases = os.environ.get("KVTIER_E2E_PHASES", "abc")
    server = None
    binary = os.environ.get("KVTIER_E2E_REDIS_SERVER")
    if binary:
        server, env["KVTIER_E2E_SHARED_URL"] = start_redis(binary)
        phases += "" if "d" in phases else "d"
    print(
        f"runner: shape {SHAPE_NAME}, lengths {LENGTHS} x {REPS}, phases {phases}, "
        f"records {'sealed' if ENCRYPT else 'plain'}, shared tier "
        f"{env.get('KVTIER_E2E_SHARED_URL', 'none')}",
        flush=True,
    )
    status = 0
    try:
        for phase in phases:
            started = time.time()
            done = subprocess.run([sys.executable, __file__, phase], env=env, timeout=900)
            print(
                f"== phase {phase}: rc {done.returncode} in {time.time() - started:.0f}s",
                flush=True,
            )
            status |= done.returncode
            if phase == "a" and done.returncode:
                break
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    return status


if __name__ == "__main__":
    sys.exit(main())
