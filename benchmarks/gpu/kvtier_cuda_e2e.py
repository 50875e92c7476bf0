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
  ``reset_prefix_cache``; then a second prompt of each length, cold and its oracle, for c's
  and f's restores beside (``RESTORE_BESIDE``); then waits until kvtier's disk tier holds the
  prompts' blocks. At its
  shutdown the engine leaves the restore decision's evidence (its timed prefills, its disk
  probes) beside the records (``<disk>/<namespace>/decision.json``).
* b: a fresh process: each prompt restored from the disk tier with the restore decision
  opted out per request (``kvtier_restore_decision: false``), so the disk really is read;
  the output must equal the oracle and the engine must report cached tokens. Its disk loads
  join the folder's evidence.
* c: a fresh process with the decision on, starting from the evidence a and b left. First,
  per prompt, what that evidence predicts (restore and recompute seconds, the verdict at the
  policy's safety factor) next to a's cold prefill and b's restore: whether a verdict follows
  from the predictions or from the factor. Then, per length, the decision's verdict
  (``kvtier:restore_decisions``; ``unmeasured`` would mean it restored unweighed) and its
  TTFT next to cold (a) and the disk restore (b), and next to a new prompt of the same length
  prefilled cold right after it in the same process ("cold here": a ratio free of the few
  milliseconds two processes differ by; ``KVTIER_E2E_COLD_BESIDE=0`` skips it), then next to
  a's second prompt of that length restored from the disk with the decision opted out, once the
  cold prompt's writes settled ("restore here": the same restore b timed, free of the spread
  between processes; ``KVTIER_E2E_RESTORE_BESIDE=0`` skips it), and whether its verdict held
  against those two (``judged_here``: a missed gain or a loss where the path it did not take
  was faster by more than ``BOUND``). Before each
  decided prompt after the first, c waits until the disk tier's writes have settled, so its
  restores read as b's did, with nothing being written (``KVTIER_E2E_SETTLE=0``: it does not
  wait, and a restore shares the disk with the write-back of the prompts before it). The verdict
  is read from this process's prometheus_client, which the engine core's counters do not
  reach under 0.25.1's offline ``LLM`` ("none counted"): there, whether it restored or
  recomputed is told by the engine's cached tokens.
* d (with a shared tier only): a fresh process whose disk folder holds no records restores
  every prompt from the shared tier (decision opted out), output checked against the oracle.
  The folder starts with the decision evidence of the phases before (``decision.json``), which
  this process's shared loads join.
* f (with a shared tier, ``KVTIER_E2E_PHASES`` naming it, after d): as c, for the shared tier: a
  fresh process, decision on, its disk folder holding no records, only the evidence d left;
  each prompt's TTFT next to cold (a), d's shared restore, a new prompt prefilled cold and a's
  second prompt restored from the server.
  With a disk folder the shared server is the disk tier's second half, so the replay and the
  engine weigh its hits as the disk tier's (one fit of that tier's loads, local and shared).
* e (with ``KVTIER_E2E_PHASES`` naming it): records damaged on disk (one payload byte flipped
  in ``KVTIER_E2E_DAMAGE`` files, default 8), then a fresh process restores every prompt with
  the decision opted out: damaged records must be quarantined misses, outputs the oracle's.
* s: a stalled disk under a fresh process: once the engine is up, the engine core's reads of
  the disk folder's block device are throttled to a few KB/s (a cgroup io rule; root), and
  every prompt is restored with the decision opted out: each must equal the oracle and cost at
  most the deadline its tier logged plus one prefill; the stall is lifted before shutdown.
* n: cold prefill with no offloading configured (vLLM's own baseline).
* k, l, m: ``KVTIER_E2E_CONCURRENT_N`` (8) distinct prompts of
  ``KVTIER_E2E_CONCURRENT_LENGTH`` (8192) tokens submitted at once: k prefills them cold and
  stores them (folder ``disk-k``), l restores them all from the disk in a fresh process with
  the decision opted out, m does the same with the decision on; each prints the wall time
  until every first token, outputs checked against k's prefix hits.
* t, u: tenants through kvtier's connector, records sealed (a key file of the scratch folder,
  its own disk folder ``disk-t``): t serves one prompt of each length for tenant A (its
  ``cache_salt``) and waits for the disk; u, a fresh process, serves each for tenant B first
  (it must compute every token: no record of A's is found or opened for B), then for A (it
  must restore from the disk, output equal to t's prefix hit), then unsalted (computed).
* v, w: vLLM's own offloading without kvtier (CPU pool + stock ``fs`` tier in
  ``<work>/fs``): v serves each prompt cold and restores it from the CPU pool, w restores it
  from the ``fs`` tier in a fresh process; the same prompts and oracle as a.

Exit status 1 when an output differs from the oracle, a restore read nothing, or c found no
evidence to start from or decided a request unmeasured. Environment: ``KVTIER_E2E_WORK``
(scratch, default /var/tmp/kvtier-e2e), ``KVTIER_E2E_LENGTHS`` (default 2048,8192,32768),
``KVTIER_E2E_SHAPE`` (``llama-3-8b``, the default, ``qwen2.5-32b``, ``llama-3-70b-40l``,
``llama-3-70b-20l`` or ``qwen3-30b-a3b``), ``KVTIER_E2E_DROP=1``
drops the page cache before b, c, l, m and w (root), ``KVTIER_E2E_CALIBRATE=1``
also prefills cold prompts of every length in c before the stored ones (not needed: the
evidence is the earlier processes'), ``KVTIER_E2E_REPS`` (distinct prompts per length, default
1; medians are printed), ``KVTIER_E2E_DISK_THREADS`` (kvtier's ``disk_threads``; unset: its
default; a list such as ``4,16`` runs phase b once per value, each a fresh process, side by
side in one run, and the phases after it with the last), ``KVTIER_E2E_PHASES`` (default
``abc``), ``KVTIER_E2E_ENCRYPT=1``
(sealed records: AES-256-GCM under a key file made in the scratch folder),
``KVTIER_E2E_REDIS_SERVER`` (a ``redis-server`` binary: a throw-away loopback server becomes the
shared tier of every phase, and phase d runs; its folder is put on ``LD_LIBRARY_PATH`` for it),
``KVTIER_E2E_HOST_POOL`` (kvtier's host pool, default 16GiB), ``KVTIER_E2E_GPU_MEMORY`` (vLLM's
``gpu_memory_utilization``), ``KVTIER_E2E_RESTORE_BESIDE=0`` (a stores no second prompt of each
length, and c and f restore none beside each decided prompt; see ``RESTORE_BESIDE``).
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

WORK = Path(os.environ.get("KVTIER_E2E_WORK", "/var/tmp/kvtier-e2e"))
LENGTHS = [int(x) for x in os.environ.get("KVTIER_E2E_LENGTHS", "2048,8192,32768").split(",")]
REPS = int(os.environ.get("KVTIER_E2E_REPS", "1"))
ENCRYPT = os.environ.get("KVTIER_E2E_ENCRYPT") == "1"
#: kvtier's ``disk_threads`` (0: its default).
DISK_THREADS_LIST = [int(x) for x in os.environ.get("KVTIER_E2E_DISK_THREADS", "0").split(",")]
DISK_THREADS = DISK_THREADS_LIST[-1]
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
#: Llama-3-70B with 40 of its 80 layers: the same per-layer ratio of KV bytes to prefill compute
#: as the whole model (160 KiB of KV a token), and 73 GB of bf16 weights: it fits one H200.
_LLAMA_3_70B_40L = {
    **_LLAMA_3_8B,
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 40,
    "num_attention_heads": 64,
}
#: The same with 20 of its 80 layers (37 GB of weights): the same ratio again, for a card
#: under 120 GiB such as an H100.
_LLAMA_3_70B_20L = {**_LLAMA_3_70B_40L, "num_hidden_layers": 20}
#: Qwen3-30B-A3B: 48 layers, 4 KV heads x 128 (96 KiB of KV a token), 128 experts, 8 routed.
_QWEN3_30B_A3B = {
    **_QWEN2_5_32B,
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "vocab_size": 151936,
}
#: Model shapes by ``KVTIER_E2E_SHAPE`` (dummy weights: only the config is needed).
SHAPES = {
    "llama-3-8b": _LLAMA_3_8B,
    "qwen2.5-32b": _QWEN2_5_32B,
    "llama-3-70b-40l": _LLAMA_3_70B_40L,
    "llama-3-70b-20l": _LLAMA_3_70B_20L,
    "qwen3-30b-a3b": _QWEN3_30B_A3B,
}
SHAPE_NAME = os.environ.get("KVTIER_E2E_SHAPE", "llama-3-8b")
SHAPE = SHAPES[SHAPE_NAME]
#: Share of the GPU's memory vLLM may take: the 70B shape's weights alone are 73 GB
#: (``KVTIER_E2E_GPU_MEMORY``: e.g. 0.8 for eight concurrent 8k prompts of the 32B shape).
GPU_MEMORY_UTILIZATION = float(
    os.environ.get("KVTIER_E2E_GPU_MEMORY", "0.85" if SHAPE_NAME == "llama-3-70b-40l" else "0.6")
)
#: kvtier's host pool (``KVTIER_E2E_HOST_POOL``): eight concurrent 32k prompts of the 8B shape
#: restore 32 GiB through it.
HOST_POOL = os.environ.get("KVTIER_E2E_HOST_POOL", "16GiB")
#: A stalled disk's read rate (bytes/s): a 32 MiB record would take hours.
STALL_BPS = 4096
#: The stall is lifted after this long whatever happens, so a hung phase cannot outlive its call.
STALL_WATCHDOG_S = 180.0
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


def vllm_fs_config() -> dict:
    """vLLM's own offloading, no kvtier: its CPU pool and its stock ``fs`` tier."""
    return {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": 16 << 30,
            "secondary_tiers": [{"type": "fs", "root_dir": str(WORK / "fs")}],
        },
    }


def engine(disk: str = "disk", offload: str = "kvtier", encrypt: bool = ENCRYPT):  # type: ignore[no-untyped-def]
    """An engine with kvtier's tiers (``offload="kvtier"``), vLLM's own (``"vllm-fs"``) or no
    offloading (``"none"``)."""
    from vllm import LLM

    import kvtier

    config = None
    if offload == "kvtier":
        config = kvtier.kv_transfer_config(
            host_pool=HOST_POOL,
            disk_dir=WORK / disk,
            disk_capacity="64GiB",
            platform="cuda",
            shared=SHARED_URL,
            encryption_key_files=[key_file()] if encrypt else None,
            **({"disk_threads": DISK_THREADS} if DISK_THREADS else {}),
        )
    elif offload == "vllm-fs":
        config = vllm_fs_config()
    return LLM(
        model=model_dir(),
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=True,
        enable_prefix_caching=True,
        dtype="bfloat16",
        max_model_len=max(LENGTHS) + 64,
        gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
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


#: Phase a also stores a second prompt of each length (its "twin", never decided), and c and f
#: restore it with the decision opted out right after each decided prompt and its cold
#: companion: the decision is then set against a cold prefill and a restore of the same size
#: in its own process. Set against b's restore alone it is not: the same records took 0.67 s
#: and 0.89 s to restore in two b processes on one H200 (docs/benchmarks.md), a spread wider
#: than the 5 % the decision is held to. ``KVTIER_E2E_RESTORE_BESIDE=0``: not.
RESTORE_BESIDE = os.environ.get("KVTIER_E2E_RESTORE_BESIDE", "1") != "0"


def twins() -> dict[str, tuple[int, list[int]]]:
    """A second prompt of each length and name (``RESTORE_BESIDE``), distinct from
    ``prompts()``'s; empty when not asked for."""
    if not RESTORE_BESIDE:
        return {}
    rng = random.Random(17)
    return {n: (length, [rng.randrange(1000, 120000) for _ in range(length)])
            for n, (length, _) in prompts().items()}  # fmt: skip


def medians(by_name: dict[str, float], unit: str = "s") -> str:
    """Median per length of figures keyed by prompt name, as one line."""
    per_length: dict[int, list[float]] = {}
    for name, value in by_name.items():
        per_length.setdefault(int(name.split("#")[0]), []).append(value)
    return "  ".join(
        f"{n}: {statistics.median(v):.3f}{unit} (n={len(v)})" for n, v in sorted(per_length.items())
    )


def run(  # type: ignore[no-untyped-def]
    llm, ids: list[int], params: dict | None = None, salt: str | None = None
) -> tuple[float, int, list[int]]:
    """(TTFT s, cached tokens, 8 greedy tokens) of one prompt (of tenant ``salt``, its
    ``cache_salt``; None: unsalted)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra = None if params is None else {"kv_transfer_params": params}

    def sampling(n: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False, extra_args=extra
        )

    prompt = [TokensPrompt(prompt_token_ids=ids)]
    if salt is not None:
        prompt = [TokensPrompt(prompt_token_ids=ids, cache_salt=salt)]
    started = time.perf_counter()
    first = llm.generate(prompt, sampling(1), use_tqdm=False)[0]
    ttft = time.perf_counter() - started
    tokens = llm.generate(prompt, sampling(8), use_tqdm=False)[0]
    return ttft, int(first.num_cached_tokens or 0), list(tokens.outputs[0].token_ids)


def counted(name: str, by: str) -> dict[str, float]:
    """kvtier's counter ``name`` of the disk tier by its label ``by``, as this process's
    prometheus_client holds it ({} if vLLM did not export it)."""
    from prometheus_client import REGISTRY

    found: dict[str, float] = {}
    for family in REGISTRY.collect():
        if family.name != name:
            continue
        for sample in family.samples:
            if sample.name.endswith("_total") and sample.labels.get("tier") == "disk":
                value = sample.labels.get(by, "?")
                found[value] = found.get(value, 0.0) + sample.value
    return found


def decisions() -> dict[str, float]:
    """kvtier's ``kvtier:restore_decisions`` of the disk tier by verdict."""
    return counted("kvtier:restore_decisions", "verdict")


def verdict_of(before: dict[str, float], after: dict[str, float]) -> str:
    """The verdicts counted between two ``decisions()`` (one request: one verdict)."""
    grown = [v for v in sorted(after) if after[v] > before.get(v, 0.0)]
    return "+".join(grown) if grown else "none counted"


def evidence_files(folder: str) -> list[tuple[Path, dict | Exception]]:
    """Each decision evidence file under the disk folder ``folder``, parsed, or the error
    that kept it from being read (the runner reports it and goes on)."""
    found = []
    for path in sorted((WORK / folder).glob("*/decision.json")):
        try:
            found.append((path, json.loads(path.read_text())))
        except (OSError, ValueError) as exc:
            found.append((path, exc))
    return found


def evidence_summary(folder: str = "disk") -> str | None:
    """What the disk folder's decision evidence holds, in words; None if there is none."""
    found = evidence_files(folder)
    if not found:
        return None
    parts = []
    for path, doc in found:
        try:
            if isinstance(doc, Exception):
                raise doc
            loads = {t: len(v) for t, v in doc.get("tier_loads", {}).items()}
            saved = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(doc["saved_at"]))
            parts.append(
                f"{len(doc['prefill_steps'])} prefill steps, loads {loads}, saved {saved} "
                f"on {doc['device']!r}"
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            parts.append(f"{path.name} unreadable here ({exc})")
    return "; ".join(parts)


def kv_bytes_per_token() -> int:
    """bf16 K and V of every layer, per token."""
    head_dim = SHAPE.get("head_dim", SHAPE["hidden_size"] // SHAPE["num_attention_heads"])
    return SHAPE["num_hidden_layers"] * SHAPE["num_key_value_heads"] * head_dim * 2 * 2


def replay_evidence(
    measured: dict[str, dict],
    restored: dict[str, float],
    folder: str = "disk",
    phase: str = "c",
) -> None:
    """What the evidence of disk folder ``folder`` predicts for each prompt, next to what was
    measured (``measured``: a's results, each prompt's ``cold`` and ``hit``; ``restored``: b's
    disk restores, or d's shared ones): the engine's own
    policy (as kvtier's CUDA spec makes it) adopting the file, asked about a whole-prompt hit of
    the disk tier on an idle engine (with a shared tier too, the server is that tier's second
    half: one fit of its loads, local and shared). Shows whether a verdict follows from the
    predictions or from the safety factor, and how far the predictions are off.

    The predictions are each path's cost beyond what both pay (a request's own round trip, the
    step that computes its last tokens), so where a measured a prefix hit the line also
    gives each measured time less that prompt's hit: what the two predictions are weighed as.
    On short prompts that floor is most of the time (a 2k prompt of the 8B shape on the H200:
    cold 0.055 s, prefix hit 0.051 s)."""
    from kvtier.policy import evidence_file
    from kvtier.runtime.engine_policy import (
        CUDA_HOST_COPY_PRIOR_BYTES_PER_S,
        HOST_TIER,
        make_policy,
    )
    from kvtier.runtime.step_clock import STEP_TIMED_NOTE

    found = [(path, doc) for path, doc in evidence_files(folder) if isinstance(doc, dict)]
    if not found:
        return
    path, doc = found[0]
    record = evidence_file.decode(path.read_bytes(), doc["namespace"], doc["device"])
    # The engine's own margins: the narrower one within the evidence only where its prefill
    # was timed to the steps (the device description says so).
    policy = make_policy(
        True,
        time.monotonic,
        CUDA_HOST_COPY_PRIOR_BYTES_PER_S,
        prefill_timed_to_steps=str(doc["device"]).endswith(STEP_TIMED_NOTE),
    )
    policy.add_tier("disk", via=HOST_TIER)
    policy.adopt(record.evidence)
    for n, (length, _) in prompts().items():
        nbytes = full_blocks_kv_bytes(length)
        verdict = policy.decide("disk", 0, length, nbytes, count=False, queued=False)
        line = (
            f"{phase} {n}: the evidence predicts restore {verdict.restore_s:.3f}s, recompute "
            f"{verdict.recompute_s:.3f}s ({verdict.recompute_s / verdict.restore_s:.2f}x; "
            f"restored above {verdict.margin:g}x): {'restore' if verdict.restore else 'recompute'}"
        )
        if n in restored:
            cold = measured[n]["cold"]
            line += (
                f"; measured restore {restored[n]:.3f}s, cold {cold:.3f}s "
                f"({cold / restored[n]:.2f}x); predicted / measured: restore "
                f"{verdict.restore_s / restored[n]:.2f}, "
                f"recompute {verdict.recompute_s / cold:.2f}"
            )
            if (hit := measured[n].get("hit")) is not None:
                line += (
                    f"; less a prefix hit ({hit:.3f}s): restore {restored[n] - hit:.3f}s, "
                    f"recompute {cold - hit:.3f}s"
                )
        print(line, flush=True)


def disk_bytes(folder: str = "disk") -> int:
    return sum(p.stat().st_size for p in (WORK / folder).rglob("*") if p.is_file())


#: Tokens per KV block (vLLM's default on CUDA): the engine stores full blocks only.
BLOCK_TOKENS = 16


def full_blocks_kv_bytes(tokens: int) -> int:
    """KV bytes of a prompt's full blocks (the engine stores no partial block)."""
    return tokens // BLOCK_TOKENS * BLOCK_TOKENS * kv_bytes_per_token()


def prompts_kv_bytes() -> int:
    """KV bytes of the prompts' full blocks: what a tier holding every block of them holds,
    record headers aside."""
    stored = [*prompts().values(), *twins().values()]
    return sum(full_blocks_kv_bytes(n) for n, _ in stored)


T = TypeVar("T")


def until_unchanged(look: Callable[[], T], timeout_s: float) -> T | None:
    """``look()`` every two seconds until three looks in a row found what the one before found
    (or ``timeout_s`` passed); the last look, None if there was none."""
    last: T | None = None
    stable, deadline = 0, time.monotonic() + timeout_s
    while time.monotonic() < deadline and stable < 3:
        time.sleep(2)
        now = look()
        stable = stable + 1 if now == last else 0
        last = now
    return last


def wait_for_disk(timeout_s: float = 120.0, folder: str = "disk", server: bool = False) -> int:
    """Until the disk tier's files stop growing (stores cascade from the host pool), and with
    ``server`` the shared server's memory too, both in one wait (not one after the other: each
    wait costs at least three looks two seconds apart); returns the disk's bytes."""
    last = until_unchanged(lambda: (disk_bytes(folder), shared_bytes() if server else 0), timeout_s)
    return -1 if last is None else last[0]


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
    for n, (_, ids) in twins().items():
        cold = run(llm, ids)
        results[n]["twin_oracle"] = run(llm, ids)[2]  # the engine's own prefix hit
        print(
            f"a {n}: a second prompt stored, for a restore beside c's (cold {cold[0]:.3f}s)",
            flush=True,
        )
    # The server's writes trail the disk's: one wait for both (timed for the slower).
    server = bool(SHARED_URL)
    held = wait_for_disk(timeout_s=180.0 if server else 120.0, server=server)
    wanted = prompts_kv_bytes()
    print(f"a: disk tier holds {held / 2**30:.2f} GiB", flush=True)
    if held < wanted:  # later phases restore part of a prompt, recompute the rest
        print(
            f"a: WARNING: the prompts' blocks are {wanted / 2**30:.2f} GiB: the disk tier lacks "
            "some (stores dropped? see the engine's shutdown warning)",
            flush=True,
        )
    if server:
        print(f"a: shared tier holds {shared_bytes() / 2**30:.2f} GiB", flush=True)
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
    threads = f", {DISK_THREADS} disk threads" if len(DISK_THREADS_LIST) > 1 else ""
    print(
        f"b medians ({'sealed' if ENCRYPT else 'plain'} records{threads}): disk restore "
        + medians(restored),
        flush=True,
    )
    (WORK / "b.json").write_text(json.dumps(restored))
    return ok


#: Phase c also prefills a new prompt of each length cold right after each decided one
#: (``KVTIER_E2E_COLD_BESIDE=0``: not).
COLD_BESIDE = os.environ.get("KVTIER_E2E_COLD_BESIDE", "1") != "0"
#: Phase c waits, before each decided prompt after the first, until the disk tier's writes of
#: the prompts prefilled before it have settled (``KVTIER_E2E_SETTLE=0``: does not): b reads
#: with nothing being written, and with the writes running c's restores took 1.14-1.49x b's
#: (docs/benchmarks.md).
SETTLE = os.environ.get("KVTIER_E2E_SETTLE", "1") != "0"


def phase_c() -> bool:
    before = json.loads((WORK / "a.json").read_text())
    disk = json.loads((WORK / "b.json").read_text()) if (WORK / "b.json").exists() else {}
    evidence = evidence_summary()
    print(f"c: decision evidence in the folder: {evidence or 'none'}", flush=True)
    ok = evidence is not None
    replay_evidence(before, disk)
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
    return decide_each(llm, "c", before, disk, "disk restore", folder="disk") and ok


def decide_each(
    llm,  # type: ignore[no-untyped-def]
    phase: str,
    before: dict[str, dict],
    restores: dict[str, float],
    restore_name: str,
    folder: str,
) -> bool:
    """Each prompt once with the decision on, after the writes of the prompts before it have
    settled (``SETTLE``), each followed by a new prompt of its length prefilled cold
    (``COLD_BESIDE``) and then by a's second prompt of its length restored with the decision
    opted out (``RESTORE_BESIDE``); its TTFT against the better of a's cold prefill and an
    earlier phase's restores (``restores``, called ``restore_name``), and against the better
    of the two beside it; ``folder``: this process's disk folder. True if every output
    equalled the oracle, every second prompt was restored, and no hit was restored
    unweighed."""
    decided: dict[str, float] = {}
    ratios: dict[str, float] = {}
    beside: dict[str, float] = {}
    here: dict[str, float] = {}
    judgements: list[str] = []
    ok = True
    rng = random.Random(13)
    twin = twins()
    for i, (n, (length, ids)) in enumerate(prompts().items()):
        if i:
            settle(phase, n, folder)
        counted = decisions()
        ttft, cached, tokens = run(llm, ids)
        verdict = verdict_of(counted, decisions())
        if COLD_BESIDE:
            # A prompt never stored, of the same length, right after: cold prefill in this
            # very process, so the ratio carries no process-to-process difference.
            cold_here = run(llm, [rng.randrange(1000, 120000) for _ in range(length)])[0]
            beside[n] = ttft / cold_here
            print(f"{phase} {n}: cold here (a new prompt) {cold_here:.3f}s", flush=True)
            if n in twin and "twin_oracle" in before[n]:
                settle(phase, n, folder)  # the cold prompt's writes, as before a decided one
                restored, got, out = run(llm, twin[n][1], OFF)
                twin_ok = out == before[n]["twin_oracle"] and got > 0
                ok &= twin_ok
                here[n] = ttft / min(cold_here, restored)
                judged = judged_here(cached > 0, cold_here, restored)
                judgements.append(judged.split(":")[0])
                print(
                    f"{phase} {n}: {restore_name} here (a second stored prompt, decision off) "
                    f"{restored:.3f}s [{got} cached] equal={twin_ok}; decision on "
                    f"{here[n]:.2f}x the better of the two here; its verdict, against the two "
                    f"here: {judged}",
                    flush=True,
                )
        equal = tokens == before[n]["oracle"]
        ok &= equal and "unmeasured" not in verdict
        did = "restored" if cached > 0 else "recomputed"
        cold = before[n]["cold"]
        restore = restores.get(n)
        best = min(cold, restore) if restore is not None else cold
        decided[n], ratios[n] = ttft, ttft / best
        print(
            f"{phase} {n}: decision {verdict}: {did} {ttft:.3f}s [{cached} cached] "
            f"equal={equal}; cold {cold:.3f}s, {restore_name} "
            + (f"{restore:.3f}s" if restore is not None else "not run")
            + f", {ratios[n]:.2f}x the better of the two",
            flush=True,
        )
    print(f"{phase} medians: decision on " + medians(decided), flush=True)
    # Each prompt against its own cold prefill and restore, then the median per length.
    print(
        f"{phase} medians: decision on / the better of the two " + medians(ratios, "x"),
        flush=True,
    )
    if beside:
        print(f"{phase} medians: decision on / cold here " + medians(beside, "x"), flush=True)
    if here:
        print(
            f"{phase} medians: decision on / the better of cold here and {restore_name} here "
            + medians(here, "x"),
            flush=True,
        )
        print(
            f"{phase} verdicts against the two here (bound {BOUND}x): "
            f"{judgements.count('held')} held, {judgements.count('missed gain')} missed gains, "
            f"{judgements.count('loss')} losses",
            flush=True,
        )
    return ok


#: How far the path a verdict chose may be slower than the other one, measured beside it in
#: the same process, and still count as right: the bound the decision is held to.
BOUND = 1.05


def judged_here(restored: bool, cold_here: float, restore_here: float) -> str:
    """A verdict (``restored``, or recomputed) against the two paths timed beside it in its
    own process: "held", "missed gain: ..." (recomputed where the restore here beat cold
    here by more than ``BOUND``) or "loss: ..." (restored where cold here beat the restore
    here by more than ``BOUND``). Unlike the decided request's own TTFT, this sets the choice
    apart from how fast that one request happened to run."""
    if restored and restore_here > BOUND * cold_here:
        return f"loss: the restore here took {restore_here / cold_here:.2f}x cold here"
    if not restored and cold_here > BOUND * restore_here:
        return f"missed gain: cold here took {cold_here / restore_here:.2f}x the restore here"
    return "held"


def settle(phase: str, name: str, folder: str) -> None:
    """Wait until the writes of the prompts prefilled so far have settled (``SETTLE``)."""
    if not SETTLE:
        return
    waited = time.monotonic()
    held = wait_for_disk(folder=folder, server=bool(SHARED_URL))
    os.sync()  # and what the kernel still holds of them (the index; unaligned records)
    print(
        f"{phase} {name}: writes settled in {time.monotonic() - waited:.0f}s "
        f"({held / 2**30:.2f} GiB on disk)",
        flush=True,
    )


def seed_evidence(source: str, target: str) -> int:
    """A new disk folder ``target`` holding no records, only what each namespace of disk folder
    ``source`` says of itself (``namespace.json``) and of its decision evidence
    (``decision.json``), private as the store makes them. So a process on ``target`` weighs its
    hits with the earlier processes' evidence, yet its own disk has nothing to restore: a
    machine whose local disk has lost the prompts that the shared tier still holds. Returns the
    evidence files copied."""
    copied = 0
    root = WORK / target
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    for evidence in sorted((WORK / source).glob("*/decision.json")):
        folder = root / evidence.parent.name
        folder.mkdir(mode=0o700, exist_ok=True)
        for name in ("namespace.json", "decision.json"):
            data = (evidence.parent / name).read_bytes()
            fd = os.open(folder / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        copied += 1
    return copied


def phase_d() -> bool:
    """A fresh process whose disk folder holds no records: every prompt from the shared tier
    (decision opted out). The folder starts with the decision evidence of the phases before,
    so the evidence this process leaves (its shared loads added) is what f starts from."""
    before = json.loads((WORK / "a.json").read_text())
    seeded = seed_evidence("disk", "disk-d")
    print(f"d: no records on disk; decision evidence of the phases before: {seeded}", flush=True)
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
    (WORK / "d.json").write_text(json.dumps(restored))
    return ok


def phase_f() -> bool:
    """A fresh process, decision on, whose disk folder holds no records, only the evidence d
    left (a's prefills, b's disk loads, d's shared loads): each prompt is a hit of the shared
    tier alone, restored or recomputed as the decision weighs it."""
    before = json.loads((WORK / "a.json").read_text())
    shared = json.loads((WORK / "d.json").read_text()) if (WORK / "d.json").exists() else {}
    evidence = evidence_summary("disk-d")
    print(f"f: decision evidence d left: {evidence or 'none'}", flush=True)
    ok = evidence is not None
    replay_evidence(before, shared, folder="disk-d", phase="f")
    seed_evidence("disk-d", "disk-f")
    llm = engine(disk="disk-f")
    run(llm, [5] * 512)
    return decide_each(llm, "f", before, shared, "shared restore", folder="disk-f") and ok


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
    # a's second prompts too (RESTORE_BESIDE): the damaged records are drawn from all of them.
    stored = [(n, ids, before[n]["oracle"], before[n]["cold"]) for n, (_, ids) in prompts().items()]
    stored += [
        (f"{n} (second prompt)", ids, before[n]["twin_oracle"], before[n]["cold"])
        for n, (_, ids) in twins().items()
        if "twin_oracle" in before[n]
    ]
    for name, ids, oracle, cold in stored:
        ttft, cached, tokens = run(llm, ids, OFF)
        equal = tokens == oracle
        ok &= equal
        print(
            f"e {name}: restore over damaged records {ttft:.3f}s [{cached} cached] "
            f"equal={equal} vs cold {cold:.3f}s",
            flush=True,
        )
    quarantined = [p for p in (WORK / "disk").rglob("*") if "quarantine" in p.parts and p.is_file()]
    print(f"e: {len(quarantined)} records quarantined", flush=True)
    return ok and len(quarantined) > 0


def phase_n() -> bool:
    """Cold prefill with no offloading configured at all (vLLM's own baseline row)."""
    llm = engine(offload="none")
    run(llm, [5] * 512)
    cold = {}
    for n, (_, ids) in prompts().items():
        cold[n] = run(llm, ids)[0]
        print(f"n {n}: cold prefill, no offloading {cold[n]:.3f}s", flush=True)
    print("n medians: cold, no offloading " + medians(cold), flush=True)
    return True


def phase_v() -> bool:
    """vLLM's own offloading (CPU pool + stock fs tier, no kvtier): cold, then its CPU-pool
    restore; waits until the fs tier holds the prompts."""
    before = json.loads((WORK / "a.json").read_text())
    llm = engine(offload="vllm-fs")
    run(llm, [5] * 512)
    ok, cold, pool = True, {}, {}
    for n, (_, ids) in prompts().items():
        cold[n] = run(llm, ids)[0]
        llm.reset_prefix_cache()
        time.sleep(1)
        pool[n], cached, tokens = run(llm, ids)
        equal = tokens == before[n]["oracle"]
        ok &= equal and cached > 0
        print(
            f"v {n}: cold {cold[n]:.3f}s  vLLM CPU pool restore {pool[n]:.3f}s [{cached} cached] "
            f"equal={equal}",
            flush=True,
        )
    held = wait_for_disk(folder="fs")
    print(f"v: vLLM's fs tier holds {held / 2**30:.2f} GiB", flush=True)
    print("v medians: vLLM CPU pool " + medians(pool), flush=True)
    return ok and held > 0


def phase_w() -> bool:
    """A fresh process restoring every prompt from vLLM's own fs tier (no kvtier)."""
    before = json.loads((WORK / "a.json").read_text())
    drop_page_cache()
    llm = engine(offload="vllm-fs")
    run(llm, [5] * 512)
    ok, restored = True, {}
    for n, (_, ids) in prompts().items():
        restored[n], cached, tokens = run(llm, ids)
        equal = tokens == before[n]["oracle"]
        ok &= equal and cached > 0
        print(
            f"w {n}: vLLM fs restore (fresh process) {restored[n]:.3f}s [{cached} cached] "
            f"equal={equal} vs cold {before[n]['cold']:.3f}s",
            flush=True,
        )
    print("w medians: vLLM fs restore " + medians(restored), flush=True)
    return ok


class ReadStall:
    """The disk folder's block device, its reads throttled to ``STALL_BPS`` for the processes
    moved in (a blk-throttle rule: cgroup v2 ``io.max`` or v1 ``blkio``); ``lift`` lets queued
    reads go at once. ``unavailable`` says why this host cannot (None when it can)."""

    V2, V1 = Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/blkio")

    def __init__(self, folder: Path) -> None:
        self.unavailable: str | None = None
        self.group: Path | None = None
        self.device = self._whole_disk(folder)
        if self.device is None:
            return
        if (self.V2 / "cgroup.controllers").exists():
            if "io" not in (self.V2 / "cgroup.controllers").read_text().split():
                self.unavailable = "cgroup v2 without the io controller"
                return
            try:
                (self.V2 / "cgroup.subtree_control").write_text("+io\n")
            except OSError as exc:
                self.unavailable = f"cannot enable cgroup v2 io: {exc}"
                return
            self.v2 = True
            self.group = self.V2 / "kvtier-e2e-stall"
        elif (self.V1 / "blkio.throttle.read_bps_device").exists():
            self.v2 = False
            self.group = self.V1 / "kvtier-e2e-stall"
        else:
            self.unavailable = "no cgroup io controller (neither v2 io.max nor v1 blkio)"
            return
        self.group.mkdir(exist_ok=True)

    def _whole_disk(self, folder: Path) -> str | None:
        dev = os.stat(folder).st_dev
        node = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
        if not node.exists():
            self.unavailable = f"{folder} is on no block device ({os.major(dev)}:{os.minor(dev)})"
            return None
        if (node / "partition").exists():  # throttle rules take whole disks
            node = node.resolve().parent
        return (node / "dev").read_text().strip()

    def _rule(self, bps: int | None) -> None:
        assert self.group is not None
        if self.v2:
            limit = "max" if bps is None else str(bps)
            (self.group / "io.max").write_text(f"{self.device} rbps={limit} riops=max\n")
        else:
            (self.group / "blkio.throttle.read_bps_device").write_text(
                f"{self.device} {0 if bps is None else bps}\n"
            )

    def stall(self, pids: list[int]) -> None:
        self._rule(STALL_BPS)
        assert self.group is not None
        for pid in pids:
            (self.group / "cgroup.procs").write_text(f"{pid}\n")

    def lift(self) -> None:
        self._rule(None)


def phase_s() -> bool:
    """A stalled disk under a fresh process: once the engine is up, its reads of the disk
    folder's device are throttled to a few KB/s, and every prompt is restored with the decision
    opted out. Each must cost at most its load's deadline plus one prefill (checked by the
    runner from the deadline the tier logs), equal the oracle, and the tier must log an
    abandoned load (the engine core's counters do not reach this process on 0.25.1's offline
    ``LLM``). The stall is lifted before shutdown so the stuck reads return."""
    import psutil

    before = json.loads((WORK / "a.json").read_text())
    stall = ReadStall(WORK / "disk")
    if stall.unavailable:
        print(f"s: not run: {stall.unavailable}", flush=True)
        (WORK / "s.json").write_text(json.dumps({"unavailable": stall.unavailable}))
        return True
    llm = engine()
    run(llm, [5] * 512)
    # The engine core's processes only (the tier's reads run there): this process stays free
    # to time the requests and to lift the stall. A watchdog lifts it whatever happens.
    stall.stall([child.pid for child in psutil.Process().children(recursive=True)])
    watchdog = threading.Timer(STALL_WATCHDOG_S, stall.lift)
    watchdog.daemon = True
    watchdog.start()
    print(f"s: reads of {stall.device} throttled to {STALL_BPS} B/s", flush=True)
    ok, seen = True, {}
    try:
        for n, (_, ids) in prompts().items():
            ttft, cached, tokens = run(llm, ids, OFF)
            equal = tokens == before[n]["oracle"]
            ok &= equal
            seen[n] = {"ttft": ttft, "cold": before[n]["cold"]}
            print(
                f"s {n}: restore from a stalled disk {ttft:.3f}s [{cached} cached] "
                f"equal={equal}; cold {before[n]['cold']:.3f}s",
                flush=True,
            )
    finally:
        watchdog.cancel()
        stall.lift()
        print("s: stall lifted", flush=True)
    (WORK / "s.json").write_text(json.dumps(seen))
    return ok


#: N concurrent requests of one length for phases k, l and m (the issue's N = 8 at 8k).
CONCURRENT_N = int(os.environ.get("KVTIER_E2E_CONCURRENT_N", "8"))
CONCURRENT_LENGTH = int(os.environ.get("KVTIER_E2E_CONCURRENT_LENGTH", "8192"))


def concurrent_prompts() -> list[list[int]]:
    rng = random.Random(21)
    return [
        [rng.randrange(1000, 120000) for _ in range(CONCURRENT_LENGTH)] for _ in range(CONCURRENT_N)
    ]


def batch(llm, params: dict | None = None) -> tuple[float, list[int], list[list[int]]]:  # type: ignore[no-untyped-def]
    """All of ``concurrent_prompts()`` submitted at once: (wall s until every first token,
    cached tokens of each, 8 greedy tokens of each)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra = None if params is None else {"kv_transfer_params": params}
    batch_prompts = [TokensPrompt(prompt_token_ids=ids) for ids in concurrent_prompts()]

    def sampling(n: int) -> SamplingParams:
        return SamplingParams(
            max_tokens=n, temperature=0.0, ignore_eos=True, detokenize=False, extra_args=extra
        )

    started = time.perf_counter()
    first = llm.generate(batch_prompts, sampling(1), use_tqdm=False)
    wall = time.perf_counter() - started
    full = llm.generate(batch_prompts, sampling(8), use_tqdm=False)
    return (
        wall,
        [int(o.num_cached_tokens or 0) for o in first],
        [list(o.outputs[0].token_ids) for o in full],
    )


def phase_k() -> bool:
    """N concurrent cold prefills (stored to the folder ``disk-k``), then their prefix hits:
    the oracle of phases l and m."""
    llm = engine(disk="disk-k")
    run(llm, [5] * 512)
    cold, _, _ = batch(llm)
    hit, _, oracle = batch(llm)
    held = wait_for_disk(folder="disk-k")
    print(
        f"k: {CONCURRENT_N} x {CONCURRENT_LENGTH} concurrent cold prefills {cold:.3f}s, "
        f"prefix hits {hit:.3f}s; disk tier holds {held / 2**30:.2f} GiB",
        flush=True,
    )
    (WORK / "k.json").write_text(json.dumps({"cold": cold, "oracle": oracle}))
    return held > 0


def print_evidence(phase: str, folder: str) -> None:
    """The decision's evidence in ``folder`` as measured: each prefill step's tokens and
    seconds, each disk load's bytes and seconds (what the next process will weigh with)."""
    for path, doc in evidence_files(folder):
        if isinstance(doc, Exception):
            print(f"{phase}: evidence {path.name} unreadable here ({doc})", flush=True)
            continue
        # Whole, so a decision can be replayed off the machine (RestorePolicy.adopt).
        print(f"{phase}: evidence file {json.dumps(doc, separators=(',', ':'))}", flush=True)
        try:
            steps = [
                f"{sum(n for _, n in st['segments'])}tok/{st['seconds']:.3f}s"
                for st in doc.get("prefill_steps", [])
            ]
            print(f"{phase}: evidence prefill steps {' '.join(steps)}", flush=True)
            for tier, loads in doc.get("tier_loads", {}).items():
                shown = [f"{nbytes / 2**30:.2f}GiB/{seconds:.3f}s" for nbytes, seconds in loads]
                print(f"{phase}: evidence {tier} loads {' '.join(shown)}", flush=True)
        except (KeyError, TypeError, ValueError) as exc:
            print(f"{phase}: evidence {path.name} not as expected ({exc!r})", flush=True)


def concurrent_restore(phase: str, params: dict | None) -> bool:
    before = json.loads((WORK / "k.json").read_text())
    print_evidence(phase, "disk-k")
    drop_page_cache()  # with KVTIER_E2E_DROP=1: read from the disk, as b and c are
    llm = engine(disk="disk-k")
    run(llm, [5] * 512)
    wall, cached, tokens = batch(llm, params)
    equal = tokens == before["oracle"]
    restored = sum(1 for c in cached if c > 0)
    # Which ones, in submission order: the decision restores the first of a batch.
    split = "".join("R" if c > 0 else "c" for c in cached)
    print(
        f"{phase}: {CONCURRENT_N} x {CONCURRENT_LENGTH} concurrent, fresh process, decision "
        f"{'off' if params else 'on'}: {wall:.3f}s, {restored} of {CONCURRENT_N} restored "
        f"[{split}], equal={equal}; concurrent cold prefills {before['cold']:.3f}s "
        f"({wall / before['cold']:.2f}x)",
        flush=True,
    )
    return equal and (restored == CONCURRENT_N if params else True)


def phase_l() -> bool:
    """A fresh process restores all N at once from the disk, the decision opted out."""
    return concurrent_restore("l", OFF)


def phase_m() -> bool:
    """A fresh process with the decision on, the same N at once."""
    return concurrent_restore("m", None)


def stall_bound_ok(log: str) -> bool:
    """Each stalled restore within the largest deadline its tier logged plus its prefill
    (x1.25, and 0.25 s for the request's own round trip)."""
    seen = json.loads((WORK / "s.json").read_text())
    if "unavailable" in seen:
        return True
    allowed = [float(m) for m in re.findall(r"overran its deadline \(([0-9.]+) s allowed", log)]
    if not allowed:
        print("s: the tier logged no abandoned load: the stall did not take", flush=True)
        return False
    ok = True
    for n, v in seen.items():
        bound = max(allowed) + 1.25 * v["cold"] + 0.25
        within = v["ttft"] <= bound
        ok &= within
        print(
            f"s {n}: {v['ttft']:.3f}s against a bound of {bound:.3f}s (deadline "
            f"{max(allowed):.2f}s + prefill {v['cold']:.3f}s): {'within' if within else 'OVER'}",
            flush=True,
        )
    return ok


#: Tenants of phases t and u (``cache_salt`` values).
TENANT_A, TENANT_B = "tenant-a", "tenant-b"


def phase_t() -> bool:
    llm = engine(disk="disk-t", encrypt=True)
    run(llm, [5] * 512)
    oracles = {}
    for n, (_, ids) in prompts().items():
        cold = run(llm, ids, salt=TENANT_A)
        hit = run(llm, ids, salt=TENANT_A)  # the engine's own prefix hit: the oracle
        oracles[n] = hit[2]
        print(f"t {n}: tenant A cold {cold[0]:.3f}s, prefix hit {hit[0]:.3f}s", flush=True)
    held = wait_for_disk(folder="disk-t")
    print(f"t: disk tier holds {held / 2**30:.2f} GiB of tenant A's sealed records", flush=True)
    (WORK / "t.json").write_text(json.dumps(oracles))
    return held > 0


def phase_u() -> bool:
    oracles = json.loads((WORK / "t.json").read_text())
    llm = engine(disk="disk-t", encrypt=True)
    run(llm, [5] * 512)
    ok = True
    for n, (_, ids) in prompts().items():
        other = run(llm, ids, OFF, salt=TENANT_B)
        own = run(llm, ids, OFF, salt=TENANT_A)
        unsalted = run(llm, ids, OFF)
        equal = own[2] == oracles[n]
        ok &= other[1] == 0 and own[1] > 0 and equal and unsalted[1] == 0
        print(
            f"u {n} (fresh process): tenant B {other[0]:.3f}s [{other[1]} cached], "
            f"tenant A {own[0]:.3f}s [{own[1]} cached] equal={equal}, "
            f"unsalted {unsalted[0]:.3f}s [{unsalted[1]} cached]",
            flush=True,
        )
    return ok


PHASES = {
    "a": phase_a,
    "b": phase_b,
    "c": phase_c,
    "d": phase_d,
    "e": phase_e,
    "f": phase_f,
    "k": phase_k,
    "l": phase_l,
    "m": phase_m,
    "n": phase_n,
    "s": phase_s,
    "t": phase_t,
    "u": phase_u,
    "v": phase_v,
    "w": phase_w,
}


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


def run_phase(phase: str, env: dict[str, str]) -> tuple[int, str]:
    """Run one phase in a process of its own, its output passed through and kept."""
    child = subprocess.Popen(
        [sys.executable, __file__, phase],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    )
    lines = []
    assert child.stdout is not None
    for line in child.stdout:
        sys.stdout.write(line)
        sys.stdout.flush()
        lines.append(line)
    return child.wait(timeout=900), "".join(lines)


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
        if "d" not in phases:  # before f, which starts from the evidence d leaves
            phases = phases.replace("f", "df") if "f" in phases else phases + "d"
    elif set(phases) & set("df"):
        print("runner: phases d and f need a shared tier: set KVTIER_E2E_REDIS_SERVER", flush=True)
        return 2
    threads = ",".join(map(str, DISK_THREADS_LIST)) if DISK_THREADS else "default"
    print(
        f"runner: shape {SHAPE_NAME}, lengths {LENGTHS} x {REPS}, phases {phases}, "
        f"records {'sealed' if ENCRYPT else 'plain'}, disk threads {threads}, "
        f"shared tier {env.get('KVTIER_E2E_SHARED_URL', 'none')}, host pool {HOST_POOL}, "
        f"gpu memory {GPU_MEMORY_UTILIZATION}, concurrent {CONCURRENT_N} x {CONCURRENT_LENGTH}",
        flush=True,
    )
    status = 0
    try:
        for phase in phases:
            started = time.time()
            if phase == "b" and len(DISK_THREADS_LIST) > 1:
                rc = 0
                for threads in DISK_THREADS_LIST:  # the last one's b.json is c's
                    rc |= run_phase(phase, {**env, "KVTIER_E2E_DISK_THREADS": str(threads)})[0]
            else:
                rc, log = run_phase(phase, env)
            if phase == "s" and rc == 0 and not stall_bound_ok(log):
                rc = 1
            print(f"== phase {phase}: rc {rc} in {time.time() - started:.0f}s", flush=True)
            status |= rc
            if phase == "a" and rc:
                break
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)
    return status


if __name__ == "__main__":
    sys.exit(main())
