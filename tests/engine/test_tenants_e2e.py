"""Tenants inside a real engine: kvtier's connector, loaded by ``kv_connector_module_path``,
tags each request with its ``cache_salt``, and with ``require_cache_salt`` an unsalted request
(or one whose client wrote a tenant under kvtier's key) causes no disk store and no disk
restore, its output equal to the plain engine's, while a salted prompt is stored and restored
from disk for its own salt only."""

import os
from pathlib import Path

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig
from kvtier.runtime.tenants import TENANT_KEY
from tests.support.engine import record_files, sole_namespace_dir, until_offloaded
from tests.support.oracle import check_restore, resume_reference
from tests.support.prompts import random_prompt

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPT_LEN = 1000
MAX_TOKENS = 16
BLOCKS = 7  # whole 128-token blocks of the 1000-token prompt
RESTORED = 896
FROM_DISK = "vllm:prompt_tokens_cached_by_source{source=disk}"


def config(model: Path, disk_dir: Path, key: Path) -> EngineConfig:
    return EngineConfig(
        model=str(model),
        kv_transfer_config=kvtier.kv_transfer_config(
            restore_decision=False,  # the data path is under test: restore every hit
            host_pool="128MiB",
            disk_dir=disk_dir,
            disk_capacity="512MiB",
            allow_small_tiers=True,
            encryption_key_files=[str(key)],
            require_cache_salt=True,
        ),
        in_process=True,
    )


def test_unsalted_requests_never_reach_the_disk_and_a_salted_one_restores_for_its_salt(
    start_engine, tiny_model, tmp_path, plain_engine
):
    key = tmp_path / "key"
    key.write_bytes(os.urandom(32).hex().encode())
    os.chmod(key, 0o600)
    disk_dir = tmp_path / "disk"
    disk_dir.mkdir()
    engine = start_engine(config(tiny_model, disk_dir, key), "kvtier-require-salt")
    unsalted = random_prompt(500, PROMPT_LEN)
    forged = random_prompt(501, PROMPT_LEN)
    salted = random_prompt(502, PROMPT_LEN)
    cold_unsalted, _ = plain_engine.generate_one(unsalted, MAX_TOKENS)
    reference = resume_reference(plain_engine, salted, MAX_TOKENS)

    engine.generate_one(unsalted, MAX_TOKENS)
    engine.generate_one(
        forged, MAX_TOKENS, kv_transfer_params={TENANT_KEY: {"cache_salt": "tenant-a"}}
    )
    engine.generate_one(salted, MAX_TOKENS, cache_salt="tenant-a")
    ns = sole_namespace_dir(disk_dir)
    until_offloaded(engine, lambda: len(record_files(ns)) >= BLOCKS)
    assert engine.reset_prefix_cache(reset_connector=True)  # waits for in-flight stores
    assert len(record_files(ns)) == BLOCKS, "only the salted prompt's blocks are on disk"

    before = engine.metrics().get(FROM_DISK, 0)
    again, _ = engine.generate_one(unsalted, MAX_TOKENS)
    assert again.num_cached_tokens == 0
    assert again.token_ids == cold_unsalted.token_ids
    other, _ = engine.generate_one(salted, MAX_TOKENS, cache_salt="tenant-b")
    assert other.num_cached_tokens == 0, "another salt never finds tenant-a's blocks"
    assert engine.metrics().get(FROM_DISK, 0) == before, "no disk restore so far"
    restored, _ = engine.generate_one(salted, MAX_TOKENS, cache_salt="tenant-a")
    assert restored.num_cached_tokens == RESTORED
    assert engine.metrics()[FROM_DISK] - before == RESTORED
    check_restore(restored, reference)
