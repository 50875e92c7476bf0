"""Tenants inside a real engine: kvtier's connector, loaded by ``kv_connector_module_path``,
tags each request with its ``cache_salt``, and with ``require_cache_salt`` an unsalted request
(or one whose client wrote a tenant under kvtier's key) causes no disk store and no disk
restore, its output equal to the plain engine's, while a salted prompt is stored and restored
from disk for its own salt only. Each tenant's records are sealed under its own keys: two
tenants serving one prompt store two record sets, one tenant's records planted under the
other's names are never served, and a fresh engine restores each tenant's prompt for that
tenant only.

The tests share one engine (and one restart), in file order: the suite's time is mostly
engines starting."""

import dataclasses
import os
from pathlib import Path

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig
from kvtier.format import HEADER_BYTES
from kvtier.format.record import decode_header, encode_header
from kvtier.runtime.tenants import TENANT_KEY
from tests.support.engine import (
    record_files,
    sole_namespace_dir,
    store_on_disk_only,
    until_offloaded,
)
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


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path]:
    """The disk folder and the key file the module's engines share."""
    key = tmp_path_factory.mktemp("keys") / "key"
    key.write_bytes(os.urandom(32).hex().encode())
    os.chmod(key, 0o600)
    return tmp_path_factory.mktemp("disk"), key


@pytest.fixture(scope="module")
def engine(start_engine, tiny_model, folders):
    disk_dir, key = folders
    return start_engine(config(tiny_model, disk_dir, key), "kvtier-require-salt")


#: The prompt both tenants serve (and a fresh engine restores for each).
SHARED_PROMPT = random_prompt(503, PROMPT_LEN)


def test_unsalted_requests_never_reach_the_disk_and_a_salted_one_restores_for_its_salt(
    engine, folders, plain_engine
):
    disk_dir, _ = folders
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


def test_two_tenants_serving_one_prompt_store_two_record_sets_each_restored_for_its_own(
    engine, folders, plain_engine
):
    ns = sole_namespace_dir(folders[0])
    reference = resume_reference(plain_engine, SHARED_PROMPT, MAX_TOKENS)
    alice = store_on_disk_only(engine, ns, SHARED_PROMPT, MAX_TOKENS, cache_salt="tenant-a")
    before = engine.metrics().get(FROM_DISK, 0)
    bob = store_on_disk_only(engine, ns, SHARED_PROMPT, MAX_TOKENS, cache_salt="tenant-b")
    assert engine.metrics().get(FROM_DISK, 0) == before, "tenant-b never restored tenant-a's"
    assert len(alice) == len(bob) == BLOCKS and not set(alice) & set(bob)
    for salt in ("tenant-a", "tenant-b"):
        restored, _ = engine.generate_one(SHARED_PROMPT, MAX_TOKENS, cache_salt=salt)
        assert restored.num_cached_tokens == RESTORED, salt
        check_restore(restored, reference)
    assert engine.metrics()[FROM_DISK] - before == 2 * RESTORED
    assert engine.reset_prefix_cache(reset_connector=True)


def test_a_tenants_records_planted_under_another_tenants_names_are_never_served(
    engine, folders, plain_engine
):
    ns = sole_namespace_dir(folders[0])
    prompt = random_prompt(504, PROMPT_LEN)
    cold, _ = plain_engine.generate_one(prompt, MAX_TOKENS)
    alice = store_on_disk_only(engine, ns, prompt, MAX_TOKENS, cache_salt="tenant-a")
    bob = store_on_disk_only(engine, ns, prompt, MAX_TOKENS, cache_salt="tenant-b")
    digest = bytes.fromhex(ns.name)
    # Someone with write access: each of tenant-b's files replaced by one of tenant-a's
    # records, its header rewritten to tenant-b's name (the header checksum is keyless).
    for mine, theirs in zip(alice, bob, strict=True):
        data = mine.read_bytes()
        header = decode_header(data[:HEADER_BYTES], digest, _name_in(data))
        renamed = dataclasses.replace(header, key=_name_in(theirs.read_bytes()))
        theirs.write_bytes(encode_header(renamed) + data[HEADER_BYTES:])
    before = engine.metrics().get(FROM_DISK, 0)
    result, _ = engine.generate_one(prompt, MAX_TOKENS, cache_salt="tenant-b")
    assert result.num_cached_tokens == 0, "no planted record may be served"
    assert result.token_ids == cold.token_ids
    assert engine.metrics().get(FROM_DISK, 0) == before
    quarantined = list((ns / "quarantine").glob("*.kvb"))
    assert quarantined and all(".auth." in p.name for p in quarantined)
    mine, _ = engine.generate_one(prompt, MAX_TOKENS, cache_salt="tenant-a")
    assert mine.num_cached_tokens == RESTORED, "tenant-a's own records are untouched"
    check_restore(mine, resume_reference(plain_engine, prompt, MAX_TOKENS))


def _name_in(record: bytes) -> bytes:
    """The name field of a record's header."""
    return record[48 : 48 + int.from_bytes(record[14:16], "little")]


def test_a_fresh_engine_restores_each_tenants_prompt_for_that_tenant_only(
    engine, start_engine, tiny_model, folders, plain_engine
):
    engine.close()
    fresh = start_engine(config(tiny_model, *folders), "kvtier-tenants-restart")
    reference = resume_reference(plain_engine, SHARED_PROMPT, MAX_TOKENS)
    cold, _ = plain_engine.generate_one(SHARED_PROMPT, MAX_TOKENS)
    # A client naming tenant-a under kvtier's key, with a salt of its own: its own tenant.
    forged, _ = fresh.generate_one(
        SHARED_PROMPT,
        MAX_TOKENS,
        cache_salt="tenant-c",
        kv_transfer_params={TENANT_KEY: {"cache_salt": "tenant-a"}},
    )
    assert forged.num_cached_tokens == 0 and forged.token_ids == cold.token_ids
    for salt in ("tenant-a", "tenant-b"):
        restored, _ = fresh.generate_one(SHARED_PROMPT, MAX_TOKENS, cache_salt=salt)
        assert restored.num_cached_tokens == RESTORED, salt
        check_restore(restored, reference)
    assert fresh.metrics()[FROM_DISK] == 2 * RESTORED
