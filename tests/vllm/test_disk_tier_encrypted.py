"""KvtierDiskTier with encryption on: rows round-trip through sealed records, a restart with a
rotated key reads the old ones, and a key file others can read refuses start-up."""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path

import numpy as np
import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_offload.base import LookupResult, ReqContext

from kvtier.errors import ConfigError
from kvtier.format import HEADER_BYTES
from kvtier.format.record import decode_header, encode_header
from kvtier.format.sealing import KeyRing, MasterKey
from kvtier.runtime.tenants import TENANT_KEY, tagged_params
from kvtier.store import DiskStore
from kvtier.vllm.disk_tier import KvtierDiskTier
from kvtier.vllm.engine_context import EngineContext
from tests.support.key_files import key_file, key_file_reads
from tests.support.store import files_under
from tests.support.tiers import finish_job, stock_spec
from tests.vllm.test_disk_tier import CTX, ROW_BYTES, ROWS, key, offloading_config, run, wait_open


def make_tier(tmp_path: Path, pool: np.ndarray, *key_files: str) -> KvtierDiskTier:
    init_none_hash(sha256)
    spec = stock_spec(offloading_config(tmp_path / "model"))
    return KvtierDiskTier(
        spec,
        memoryview(pool),
        "KvtierDiskTier",
        root_dir=str(tmp_path / "disk"),
        capacity_bytes="16MiB",
        encryption={"key_files": list(key_files)},
    )


@pytest.fixture
def pool() -> np.ndarray:
    return np.zeros((ROWS, ROW_BYTES), dtype=np.int8)


def test_rows_round_trip_sealed_and_survive_a_restart_with_a_rotated_key(
    tmp_path: Path, pool: np.ndarray
) -> None:
    old, new = key_file(tmp_path, bytes(range(32))), key_file(tmp_path, bytes(range(9, 41)))
    tier = make_tier(tmp_path, pool, old)
    try:
        wait_open(tier)
        pool[0] = np.arange(ROW_BYTES) % 113
        assert run(tier, 1, [key(1)], [0], False).success
    finally:
        tier.shutdown()
    names = " ".join(str(p) for p in files_under(tmp_path / "disk"))
    assert key(1)[:32].hex() not in names
    rotated = make_tier(tmp_path, pool, new, old)
    try:
        wait_open(rotated)
        assert rotated.lookup(key(1), CTX) is LookupResult.HIT
        assert run(rotated, 2, [key(1)], [4], True).success
        assert np.array_equal(pool[4], pool[0])
    finally:
        rotated.shutdown()


def test_the_tier_reads_each_key_file_once_from_start_up_to_its_first_store(
    tmp_path: Path, pool: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The keys refuse a bad file at start-up, then serve the tenants' sealers, the store (on
    # the opener thread) and the start-up line: one read, the ring handed to each.
    new, old = key_file(tmp_path, bytes(range(9, 41))), key_file(tmp_path, bytes(range(32)))
    reads = key_file_reads(monkeypatch)
    tier = make_tier(tmp_path, pool, new, old)
    try:
        wait_open(tier)
        pool[0] = np.arange(ROW_BYTES) % 113
        assert run(tier, 1, [key(1)], [0], False).success
        assert run(tier, 2, [key(1)], [4], True).success
        assert reads == [new, old]
    finally:
        tier.shutdown()


def test_a_key_file_others_can_read_refuses_start_up(tmp_path: Path, pool: np.ndarray) -> None:
    path = key_file(tmp_path, bytes(range(32)))
    os.chmod(path, 0o640)
    with pytest.raises(ConfigError, match=rf"encryption_key_files.*chmod 600 {path}"):
        make_tier(tmp_path, pool, path)


def test_the_decision_evidence_and_the_start_up_line_name_the_sealed_folder(
    tmp_path: Path, pool: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Sealed records live under another namespace digest than plain ones; the evidence file
    # beside them and the namespace the start-up line names (what `kvtier gc --namespace`
    # takes) must be that folder's, not the plain digest's, which no folder has.
    lines: list[str] = []
    monkeypatch.setattr(EngineContext, "report", lambda context, part: lines.append(part))
    tier = make_tier(tmp_path, pool, key_file(tmp_path, bytes(range(32))))
    try:
        wait_open(tier)
        (folder,) = [p for p in (tmp_path / "disk").iterdir() if p.is_dir()]
        assert tier._memory is not None
        assert tier._memory.path.parent == folder
        (line,) = lines
        assert f"namespace {folder.name[:12]}," in line
    finally:
        tier.shutdown()


def tenant_ctx(req_id: str, salt: str | None) -> ReqContext:
    """A request context as kvtier's connector leaves it (``kvtier.vllm.connector``)."""
    return ReqContext(req_id=req_id, kv_transfer_params=tagged_params({}, salt))


def test_require_cache_salt_keeps_unsalted_requests_off_the_tier(
    tmp_path: Path, pool: np.ndarray
) -> None:
    init_none_hash(sha256)
    spec = stock_spec(offloading_config(tmp_path / "model"))
    tier = KvtierDiskTier(
        spec,
        memoryview(pool),
        "KvtierDiskTier",
        root_dir=str(tmp_path / "disk"),
        capacity_bytes="16MiB",
        encryption={
            "key_files": [key_file(tmp_path, bytes(range(32)))],
            "require_cache_salt": True,
        },
    )
    salted = tenant_ctx("a", "tenant-a")
    unsalted = tenant_ctx("u", None)
    forged = ReqContext(req_id="f", kv_transfer_params={TENANT_KEY: {"cache_salt": "tenant-a"}})
    try:
        deadline = time.monotonic() + 30
        while tier.lookup(key(99), salted) is LookupResult.RETRY:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        pool[0] = np.arange(ROW_BYTES) % 101
        before = files_under(tmp_path / "disk")
        for job_id, ctx in ((1, unsalted), (2, forged), (3, CTX)):
            assert not finish_job(tier, job_id, [key(job_id)], [0], False, ctx).success
        assert files_under(tmp_path / "disk") == before, "nothing written for them"
        assert tier.counters.stores == 0
        assert finish_job(tier, 4, [key(4)], [0], False, salted).success
        assert tier.lookup(key(4), salted) is LookupResult.HIT
        for ctx in (unsalted, forged, CTX):
            assert tier.lookup(key(4), ctx) is LookupResult.MISS
        assert finish_job(tier, 5, [key(4)], [3], True, salted).success
        assert np.array_equal(pool[3], pool[0])
    finally:
        tier.shutdown()


def sealed_tier(tmp_path: Path, pool: np.ndarray, secret: bytes) -> KvtierDiskTier:
    return make_tier(tmp_path, pool, key_file(tmp_path, secret))


def test_each_tenants_blocks_are_stored_and_loaded_under_its_own_keys(
    tmp_path: Path, pool: np.ndarray
) -> None:
    secret = bytes(range(32))
    tier = sealed_tier(tmp_path, pool, secret)
    alice, bob, unsalted = tenant_ctx("a", "alice"), tenant_ctx("b", "bob"), tenant_ctx("u", None)
    try:
        wait_open(tier)
        pool[0] = np.arange(ROW_BYTES) % 97
        pool[1] = np.arange(ROW_BYTES) % 89
        assert finish_job(tier, 1, [key(1)], [0], False, alice).success
        assert tier.lookup(key(1), alice) is LookupResult.HIT
        for other in (bob, unsalted, CTX):
            assert tier.lookup(key(1), other) is LookupResult.MISS
        assert finish_job(tier, 2, [key(1)], [1], False, bob).success
        assert finish_job(tier, 3, [key(1)], [4], True, alice).success
        assert finish_job(tier, 4, [key(1)], [5], True, bob).success
        assert np.array_equal(pool[4], pool[0]) and np.array_equal(pool[5], pool[1])
        assert len(files_under(tmp_path / "disk" / tier.store.namespace_dir.name / "blocks")) == 2
    finally:
        tier.shutdown()
    # The records are each tenant's: a store opened with Alice's keys reads hers alone.
    ring = KeyRing([MasterKey(secret)])
    namespace = tier.store.namespace
    with DiskStore(tmp_path / "disk", namespace, sealer=ring.tenant("alice")) as as_alice:
        out = bytearray(tier.record_bytes)
        assert as_alice.get_into(key(1), memoryview(out))
        assert bytes(out) == pool[0].tobytes()[: tier.record_bytes]
        others: list[bytes] = []
        assert as_alice.verify(unauthenticated=others.append) == [] and len(others) == 1


def test_a_tenants_record_copied_under_another_tenants_name_is_never_loaded(
    tmp_path: Path, pool: np.ndarray
) -> None:
    secret = bytes(range(32))
    tier = sealed_tier(tmp_path, pool, secret)
    alice, bob = tenant_ctx("a", "alice"), tenant_ctx("b", "bob")
    try:
        wait_open(tier)
        pool[0] = np.arange(ROW_BYTES) % 97
        pool[1] = np.arange(ROW_BYTES) % 89
        assert finish_job(tier, 1, [key(1)], [0], False, alice).success
        assert finish_job(tier, 2, [key(1)], [1], False, bob).success
        store = tier.store
        digest = store.namespace.digest()
        paths = {p.name[:32]: p for p in files_under(store.namespace_dir / "blocks")}
        ring = KeyRing([MasterKey(secret)])
        name_a, name_b = (ring.tenant(s).name(digest, key(1)).hex() for s in ("alice", "bob"))
        data = paths[name_a].read_bytes()
        header = decode_header(data[:HEADER_BYTES], digest, bytes.fromhex(name_a))
        renamed = dataclasses.replace(header, key=bytes.fromhex(name_b))
        paths[name_b].write_bytes(encode_header(renamed) + data[HEADER_BYTES:])
        pool[5] = 0
        assert not finish_job(tier, 3, [key(1)], [5], True, bob).success
        assert store.stats().corrupt == {"auth": 1} and store.stats().quarantined == 1
        assert tier.lookup(key(1), bob) is LookupResult.MISS
        assert finish_job(tier, 4, [key(1)], [6], True, alice).success
        assert np.array_equal(pool[6], pool[0])
    finally:
        tier.shutdown()
