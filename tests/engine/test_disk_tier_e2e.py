"""kvtier's disk tier inside a real engine: bad blocks become misses, tenants stay apart.

Each scenario stores a prompt, empties the engine cache and the host pool
(``reset_prefix_cache(reset_connector=True)``) so only the disk tier holds its blocks, then
damages the disk under the running engine. The lookup of those blocks is already positive (the
index is in memory), so the load must fail, the request must complete by recompute within a
bounded time, and the output must equal a cold run of the same prompt.
"""

import os
import stat
from pathlib import Path

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig, ProcessEngine
from tests.support.engine import (
    record_stems,
    sole_namespace_dir,
    store_on_disk_only,
    until_offloaded,
)
from tests.support.oracle import check_restore, resume_reference
from tests.support.prompts import random_prompt

pytestmark = [pytest.mark.engine, pytest.mark.timeout(600)]

PROMPT_LEN = 1000
MAX_TOKENS = 16
FROM_DISK = "vllm:prompt_tokens_cached_by_source{source=disk}"


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kvtier-disk")


@pytest.fixture(scope="module")
def engine(start_engine, tiny_model, disk_dir) -> ProcessEngine:
    config = EngineConfig(
        model=str(tiny_model),
        kv_transfer_config=kvtier.kv_transfer_config(
            restore_decision=False,  # the data path is under test: restore every hit
            host_pool="128MiB",
            disk_dir=disk_dir,
            disk_capacity="512MiB",
            allow_small_tiers=True,  # evictions here are explicit prefix-cache resets
        ),
        in_process=True,
    )
    return start_engine(config, "kvtier-disk-tier")


def record_files(disk_dir: Path) -> set[Path]:
    return set((sole_namespace_dir(disk_dir) / "blocks").rglob("*.kvb"))


def cold_output(plain_engine: ProcessEngine, prompt: list[int]) -> list[int]:
    result, _ = plain_engine.generate_one(prompt, MAX_TOKENS)
    assert result.num_cached_tokens == 0
    return result.token_ids


def test_records_are_private_and_restored_across_the_disk_tier(engine, disk_dir, plain_engine):
    prompt = random_prompt(300, PROMPT_LEN)
    reference = resume_reference(plain_engine, prompt, MAX_TOKENS)
    added = store_on_disk_only(engine, sole_namespace_dir(disk_dir), prompt, MAX_TOKENS)
    for path in added:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    for folder in (disk_dir, sole_namespace_dir(disk_dir), next(iter(added)).parent):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    before = engine.metrics()
    restored, _ = engine.generate_one(prompt, MAX_TOKENS)
    assert restored.num_cached_tokens == 896
    assert engine.metrics()[FROM_DISK] - before.get(FROM_DISK, 0) == 896
    check_restore(restored, reference)


def test_blocks_corrupted_after_a_positive_lookup_are_recomputed(engine, disk_dir, plain_engine):
    prompt = random_prompt(301, PROMPT_LEN)
    expected = cold_output(plain_engine, prompt)
    damaged = store_on_disk_only(engine, sole_namespace_dir(disk_dir), prompt, MAX_TOKENS)
    for path in damaged:
        with open(path, "r+b") as f:  # flip one payload bit, past the 4 KiB header
            f.seek(4096 + 1000)
            byte = f.read(1)
            f.seek(4096 + 1000)
            f.write(bytes([byte[0] ^ 0x01]))
    result, _ = engine.generate_one(prompt, MAX_TOKENS)
    assert result.num_cached_tokens == 0, "no damaged block may be served"
    assert result.token_ids == expected
    quarantined = list((sole_namespace_dir(disk_dir) / "quarantine").glob("*.kvb"))
    assert len(quarantined) >= PROMPT_LEN // 128
    assert all("checksum" in p.name for p in quarantined)
    # the recompute stored good blocks again: the next eviction round restores them
    until_offloaded(engine, lambda: record_stems(damaged) <= record_stems(record_files(disk_dir)))
    assert engine.reset_prefix_cache(reset_connector=True)
    again, _ = engine.generate_one(prompt, MAX_TOKENS)
    assert again.num_cached_tokens == 896


def test_blocks_deleted_after_a_positive_lookup_are_recomputed(engine, disk_dir, plain_engine):
    prompt = random_prompt(302, PROMPT_LEN)
    expected = cold_output(plain_engine, prompt)
    for path in store_on_disk_only(engine, sole_namespace_dir(disk_dir), prompt, MAX_TOKENS):
        path.unlink()
    result, _ = engine.generate_one(prompt, MAX_TOKENS)
    assert result.num_cached_tokens == 0
    assert result.token_ids == expected


def test_cache_salt_keeps_tenants_apart(engine, disk_dir, plain_engine):
    prompt = random_prompt(303, PROMPT_LEN)
    reference = resume_reference(plain_engine, prompt, MAX_TOKENS)
    before = record_files(disk_dir)
    engine.generate_one(prompt, MAX_TOKENS, cache_salt="tenant-a")
    want = PROMPT_LEN // 128
    until_offloaded(engine, lambda: len(record_files(disk_dir) - before) >= want)
    assert engine.reset_prefix_cache(reset_connector=True)
    other, _ = engine.generate_one(prompt, MAX_TOKENS, cache_salt="tenant-b")
    assert other.num_cached_tokens == 0, "tenant b must not get tenant a's blocks"
    assert engine.reset_prefix_cache(reset_connector=True)
    same, _ = engine.generate_one(prompt, MAX_TOKENS, cache_salt="tenant-a")
    assert same.num_cached_tokens == 896
    check_restore(same, reference)


def test_disk_usage_stays_under_the_cap(engine, disk_dir):
    total = sum(p.stat().st_size for p in record_files(disk_dir))
    assert 0 < total <= 512 * 2**20
    assert not any(sole_namespace_dir(disk_dir).joinpath("tmp").iterdir()), "no temp file left"
    assert os.access(disk_dir / "index.sqlite3", os.R_OK), "one index per disk folder"
