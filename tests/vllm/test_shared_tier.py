"""The shared tier's vLLM side without a server: composite store, remote lookups, settings."""

import numpy as np
import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import TransferJob

from kvtier import native
from kvtier.dataplane.abandonable import AbandonableLoad, LoadState
from kvtier.errors import ConfigError
from kvtier.format import HEADER_BYTES
from kvtier.runtime.tenants import tagged_params
from kvtier.settings import SharedTierSettings
from kvtier.store import DiskStore, MemoryStore, RecordIO, RecordWriter
from kvtier.store.base import FixedClaim
from kvtier.store.tiered import LocalThenShared
from kvtier.vllm.disk_tier import KvtierDiskTier
from kvtier.vllm.shared_tier import KvtierSharedTier, open_shared_store
from tests.support.fake_remote import FakeRemoteStore
from tests.support.key_files import key_file, key_file_reads
from tests.support.store import (
    PAYLOAD_BYTES,
    aligned_buffer,
    disk_capacity,
    key_of,
    make_namespace,
    payload_of,
)
from tests.support.tiers import offloading_config, stock_spec
from tests.support.waiting import wait_until

ROWS, ROW_BYTES = 8, 8192
CTX = ReqContext(req_id="r")


def key(i: int) -> bytes:
    return bytes([i]) * 32 + (0).to_bytes(4, "big")


def test_a_shared_hit_is_written_back_to_the_local_store():
    local, shared = MemoryStore(1 << 20), FakeRemoteStore()
    store = LocalThenShared(local, shared)
    shared.put_from_another_replica(key(1), b"a" * 64)
    assert not store.contains(key(1))
    assert store.exists_many([key(1), key(2)]) == {key(1)}
    out = bytearray(64)
    assert store.get_into(key(1), memoryview(out)) and out == b"a" * 64
    assert wait_until(lambda: local.contains(key(1)), 30, 0.01), "never written back"
    assert store.written_back == 1
    store.close()


def test_puts_go_to_both_stores_and_local_is_read_first():
    local, shared = MemoryStore(1 << 20), FakeRemoteStore()
    store = LocalThenShared(local, shared)
    assert store.put(key(2), b"b" * 64)
    assert local.contains(key(2)) and shared.contains(key(2))
    assert store.without_server() is local, "what is kept when the server falls behind"
    hits = shared.stats().hits
    assert store.get(key(2)) == b"b" * 64
    assert shared.stats().hits == hits, "a local hit never asks the server"
    store.close()


@pytest.fixture
def tier(tmp_path):
    init_none_hash(sha256)
    remote = FakeRemoteStore()
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    made = KvtierSharedTier(
        spec,
        memoryview(pool),
        "KvtierSharedTier",
        url="redis://127.0.0.1:1",
        store_factory=lambda settings, namespace: remote,
        check=lambda settings, row_bytes: None,
    )
    yield made, remote, pool
    made.shutdown()


def test_a_key_another_replica_stored_is_found_by_asking_the_server(tier):
    made, remote, _ = tier
    assert wait_until(lambda: made.store is not None, 30, 0.01), "the store never opened"
    remote.put_from_another_replica(key(5), bytes(ROW_BYTES))
    assert made.lookup(key(5), CTX) is LookupResult.RETRY, "unknown: ask the server"
    assert made.lookup(key(6), CTX) is LookupResult.RETRY
    assert wait_until(lambda: made.lookup(key(5), CTX) is LookupResult.HIT, 30, 0.01), "never found"
    answered = wait_until(lambda: made.lookup(key(6), CTX) is LookupResult.MISS, 30, 0.01)
    assert answered, "never answered"
    asked = [k for batch in remote.asked for k in batch]
    assert asked.count(key(5)) == 1 and asked.count(key(6)) == 1, "one question per key"


def held_server() -> tuple[FakeRemoteStore, list[bool]]:
    """A server whose puts wait until the list they come with is given an item."""
    held, release = FakeRemoteStore(), []

    def slow_put(k, payload):
        assert wait_until(lambda: release, 30, 0.01), "test never released the server"
        return FakeRemoteStore.put(held, k, payload)

    held.put = slow_put  # type: ignore[method-assign]
    return held, release


def bounded_tier(tmp_path, store) -> KvtierSharedTier:
    """A tier over ``store`` whose queue holds at most 2 blocks."""
    init_none_hash(sha256)
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    return KvtierSharedTier(
        spec,
        memoryview(pool),
        "t",
        url="redis://127.0.0.1:1",
        max_queued_blocks=2,
        store_factory=lambda s, n: store,
        check=lambda s, r: None,
    )


def test_stores_beyond_the_queue_bound_are_dropped_and_counted(tmp_path, caplog):
    blocked, release = held_server()
    made = bounded_tier(tmp_path, blocked)
    try:
        made.submit_store(TransferJob(1, [key(1), key(2)], np.array([0, 1]), False, CTX))
        made.submit_store(TransferJob(2, [key(3)], np.array([2]), False, CTX))
        assert made.counters.stores_dropped == 1
        release.append(True)
        made.drain_jobs()
        results = {r.job_id: r.success for r in made.get_finished_jobs()}
        assert results == {1: True, 2: False}
    finally:
        made.shutdown()
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("1 block store(s) dropped" in line and "0 stored" in line for line in said), said


def test_behind_a_disk_stores_beyond_the_bound_still_reach_the_disk_and_skip_the_server(tmp_path):
    """A shared tier that falls behind must not cost the disk its blocks: over the bound, a
    store job writes the disk alone (as a disk tier without a server would) and counts the
    server's part dropped, under the server part's name."""
    local, (blocked, release) = MemoryStore(1 << 20), held_server()
    made = bounded_tier(tmp_path, LocalThenShared(local, blocked))
    try:
        assert wait_until(lambda: made.store is not None, 30, 0.01), "the store never opened"
        made.get_stats()  # the baseline the next report is measured from
        made.submit_store(TransferJob(1, [key(1), key(2)], np.array([0, 1]), False, CTX))
        made.submit_store(TransferJob(2, [key(3)], np.array([2]), False, CTX))
        assert wait_until(lambda: local.contains(key(3)), 30, 0.01), "over the bound: no disk"
        assert not blocked.contains(key(3))
        assert made.counters.stores_dropped == 0
        assert made.counters.server_stores_dropped == 1
        release.append(True)
        made.drain_jobs()
        results = {r.job_id: r.success for r in made.get_finished_jobs()}
        assert results == {1: True, 2: True}, "the disk holds every block"
        assert all(local.contains(key(i)) for i in (1, 2, 3))
        assert blocked.contains(key(1)) and not blocked.contains(key(3))
        report = made.get_stats()
        assert report is not None
        dropped = report.data["data"]["kvtier:tier_stores_dropped"]
        assert dropped == {("shared",): 1}, dropped
    finally:
        made.shutdown()


def shared_or_disk_tier(tmp_path, kind: str, **options) -> KvtierSharedTier | KvtierDiskTier:
    """A tier with a server behind it, over a fake one: a shared tier alone, or a disk tier
    with ``shared`` options; ``options``: the server's."""
    init_none_hash(sha256)
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    server = {"url": "redis://127.0.0.1:1", **options}
    if kind == "shared":
        return KvtierSharedTier(
            spec, memoryview(pool), "t", **server,
            store_factory=lambda s, n: FakeRemoteStore(), check=lambda s, r: None,
        )  # fmt: skip
    return KvtierDiskTier(
        spec, memoryview(pool), "t", root_dir=str(tmp_path / "disk"), capacity_bytes="16MiB",
        shared=server, store_factory=lambda s, n: MemoryStore(1 << 20), check=lambda s, r: None,
    )  # fmt: skip


@pytest.mark.parametrize("kind", ["shared", "disk"])
def test_stores_waiting_for_the_server_hold_at_most_half_the_host_pool_unless_set(tmp_path, kind):
    """Each waiting block pins its host-pool row, so the default bound is the pool's, not one
    count for every model; the start-up line says it; a set bound wins."""
    made = shared_or_disk_tier(tmp_path, kind)
    try:
        assert made.settings is not None
        assert made._jobs.max_queued_blocks == ROWS // 2
        line = made.describe(FakeRemoteStore(), make_namespace())
        held = f"at most {ROWS // 2} blocks (32.00 KiB of the host pool) wait for the server"
        assert held in line, line
    finally:
        made.shutdown()
    made = shared_or_disk_tier(tmp_path, kind, max_queued_blocks=3)
    try:
        assert made._jobs.max_queued_blocks == 3
    finally:
        made.shutdown()


def test_a_disk_tier_alone_never_bounds_its_stores(tmp_path):
    init_none_hash(sha256)
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    made = KvtierDiskTier(
        spec, memoryview(pool), "t", root_dir=str(tmp_path / "disk"), capacity_bytes="16MiB"
    )
    try:
        assert made._jobs.max_queued_blocks is None
    finally:
        made.shutdown()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "many"])
def test_a_bad_server_queue_bound_refuses_start_up_naming_it(bad):
    with pytest.raises(ConfigError, match="shared_max_queued_blocks"):
        SharedTierSettings.parse({"url": "redis://cache:6379", "max_queued_blocks": bad})


def test_bad_shared_options_refuse_start_up(tmp_path):
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    with pytest.raises(ConfigError, match="op_timeout_s"):
        KvtierSharedTier(spec, memoryview(pool), "t", url="redis://h:1", op_timeout_s=0)


def test_an_unreachable_server_refuses_start_up(tmp_path):
    def unreachable(settings, row_bytes):
        raise ConfigError("shared tier: cannot reach url=redis://h:1")

    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    with pytest.raises(ConfigError, match="url"):
        KvtierSharedTier(spec, memoryview(pool), "t", url="redis://h:1", check=unreachable)


def test_credentials_never_appear_in_the_tier_description(tmp_path):
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    made = KvtierSharedTier(
        spec, memoryview(pool), "t", url="redis://kv:s3cret@cache:6379/0",
        store_factory=lambda s, n: FakeRemoteStore(), check=lambda s, r: None,
    )  # fmt: skip
    try:
        line = made.describe(FakeRemoteStore(), make_namespace())
        assert "s3cret" not in line and "kv:" not in line
        assert "redis://cache:6379" in line
        assert made.settings.username == "kv"
        assert made.settings.password is not None
        assert made.settings.password.get_secret_value() == "s3cret"
    finally:
        made.shutdown()


def test_the_password_variable_reaches_the_store_but_never_the_settings(monkeypatch):
    """KVTIER_SHARED_PASSWORD is read in the engine, so it never travels in the config."""
    monkeypatch.setenv("KVTIER_SHARED_PASSWORD", "from-env")
    opened = []
    monkeypatch.setattr(
        "kvtier.store.shared.SharedStore", lambda settings, ns, **_: opened.append(settings)
    )
    settings = SharedTierSettings.parse({"url": "redis://cache:6379"})
    open_shared_store(settings, make_namespace(), None)
    assert settings.password is None and "from-env" not in str(settings.to_dict())
    (given,) = opened
    assert given.password is not None and given.password.get_secret_value() == "from-env"
    explicit = SharedTierSettings.parse({"url": "redis://cache:6379", "password": "mine"})
    open_shared_store(explicit, make_namespace(), None)
    assert opened[-1].password.get_secret_value() == "mine", "the settings' password wins"


def test_an_encrypted_shared_tier_reads_its_key_file_once_and_seals_probe_and_store_alike(
    tmp_path, monkeypatch
):
    init_none_hash(sha256)
    opened = []

    def shared_store(settings, namespace, sealer):
        opened.append(sealer)
        return FakeRemoteStore()

    monkeypatch.setattr("kvtier.store.shared.SharedStore", shared_store)
    path = key_file(tmp_path, bytes(range(32)))
    reads = key_file_reads(monkeypatch)
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    made = KvtierSharedTier(
        spec, memoryview(pool), "t", url="redis://h:1", encryption={"key_files": [path]}
    )
    try:
        assert wait_until(lambda: made.store is not None, 30, 0.01), "never opened"
        assert "encrypted (AES-256-GCM" in made.describe(made.store, make_namespace())
        assert reads == [path]
        probe, store = opened
        assert probe is not None and probe is store, "the server check's probe is sealed too"
    finally:
        made.shutdown()


def test_a_bad_kvtier_variable_refuses_the_tiers_start_up(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTIER_LOG_LEVEL", "loud")
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    with pytest.raises(ConfigError, match=r"KVTIER_LOG_LEVEL='loud': .*use one of DEBUG, INFO"):
        KvtierSharedTier(spec, memoryview(pool), "t", url="redis://h:1", check=lambda s, r: None)


def test_a_composite_read_refused_by_its_claim_leaves_the_row_untouched():
    local, shared = MemoryStore(1 << 20), FakeRemoteStore()
    store = LocalThenShared(local, shared)
    assert store.put(key(3), b"c" * 64)
    row, bounce = bytearray(64), bytearray(64)
    assert not store.get_into_when(
        key(3), memoryview(row), FixedClaim(grant=False), memoryview(bounce)
    )
    assert row == bytearray(64)
    assert store.get_into_when(key(3), memoryview(row), FixedClaim(), memoryview(bounce))
    assert row == b"c" * 64
    store.close()


def test_the_shared_tier_is_remote_storage_over_a_store_that_asks_its_server(tier):
    from vllm.v1.kv_offload.base import Locality, Medium

    made, _, _ = tier
    assert made.locality is Locality.REMOTE, "the default when the options name none"
    assert made.medium is Medium.STORAGE
    assert wait_until(lambda: made.store is not None, 30, 0.01), "the store never opened"
    assert made.store.abilities.remote_lookup


def resident_local_disk(tmp_path) -> DiskStore:
    """A local disk store whose records stay in the page cache (written buffered, fsynced)."""
    io = RecordIO(RecordWriter(fsync="data", direct_writes=False, drop_written_pages=False))
    return DiskStore(
        tmp_path / "local",
        make_namespace(),
        disk_capacity(8),
        free_space_floor_bytes=0,
        io=io,
    )


@pytest.mark.skipif(native.record_reader() is None, reason="kvtier.native._recordread not built")
def test_a_resident_local_copy_is_read_by_the_local_stores_one_call(tmp_path):
    """The composite lets the local disk store claim and read in one native call: the row is
    written straight from the page cache, the bounce buffer never used."""
    local, shared = resident_local_disk(tmp_path), FakeRemoteStore()
    store = LocalThenShared(local, shared)
    assert store.put(key_of(1), payload_of(1))
    if not native.resident(local.record_path(key_of(1))):
        pytest.skip("the page cache did not keep the buffered write")
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    load = AbandonableLoad()
    assert store.get_into_when(key_of(1), row, load, bounce)
    assert bytes(row) == payload_of(1) and not any(bytes(bounce))
    assert load.state is LoadState.WRITTEN
    assert local.stats().page_cache_hits == 1 and shared.stats().hits == 0
    store.close()


@pytest.mark.skipif(native.record_reader() is None, reason="kvtier.native._recordread not built")
def test_a_damaged_local_copy_gives_its_claim_back_so_the_shared_copy_serves(tmp_path):
    local, shared = resident_local_disk(tmp_path), FakeRemoteStore()
    store = LocalThenShared(local, shared)
    assert store.put(key_of(1), payload_of(1))
    path = local.record_path(key_of(1))
    with open(path, "r+b") as f:  # one payload bit flipped; the pages stay cached
        f.seek(HEADER_BYTES + 9)
        flipped = bytes([f.read(1)[0] ^ 0x10])
        f.seek(HEADER_BYTES + 9)
        f.write(flipped)
    row, bounce = aligned_buffer(PAYLOAD_BYTES), aligned_buffer(PAYLOAD_BYTES)
    load = AbandonableLoad()
    assert store.get_into_when(key_of(1), row, load, bounce)
    assert bytes(row) == payload_of(1), "served from the shared copy"
    assert local.stats().corrupt == {"checksum": 1}
    assert load.state is LoadState.WRITTEN
    abandoned = AbandonableLoad()
    assert abandoned.abandon()
    row[:] = bytes(PAYLOAD_BYTES)
    assert not store.get_into_when(key_of(1), row, abandoned, bounce)
    assert not any(bytes(row)), "a load abandoned before its read is never written"
    store.close()


@pytest.mark.skipif(native.record_reader() is None, reason="kvtier.native._recordread not built")
def test_a_list_read_takes_the_local_copies_in_one_call_and_the_rest_from_the_shared_store(
    tmp_path,
):
    local, shared = resident_local_disk(tmp_path), FakeRemoteStore()
    store = LocalThenShared(local, shared)
    for n in (1, 2, 3):
        assert store.put(key_of(n), payload_of(n))
    assert local.delete(key_of(3))  # only the shared store holds 3
    path = local.record_path(key_of(2))
    with open(path, "r+b") as f:  # a payload bit of the local copy of 2 flipped
        f.seek(HEADER_BYTES + 9)
        flipped = bytes([f.read(1)[0] ^ 0x10])
        f.seek(HEADER_BYTES + 9)
        f.write(flipped)
    calls = []
    real = local._io.reader.read_claiming_many
    local._io.reader.read_claiming_many = lambda *args: calls.append(len(args[0])) or real(*args)
    keys = [key_of(n) for n in (1, 2, 3)]
    rows = [aligned_buffer(PAYLOAD_BYTES) for _ in keys]
    loads = [AbandonableLoad() for _ in keys]
    assert store.get_many_into_when(keys, rows, loads, aligned_buffer(PAYLOAD_BYTES)) == [True] * 3
    assert [bytes(r) for r in rows] == [payload_of(n) for n in (1, 2, 3)]
    assert calls == [2], "the two local copies in one native call"
    assert local.stats().corrupt == {"checksum": 1}
    assert shared.stats().hits == 2, "the damaged copy and the missing one"
    assert all(load.state is LoadState.WRITTEN for load in loads)
    store.close()


class _AbandonedOnReturn(FakeRemoteStore):
    """A shared store whose loads are abandoned by the scheduler the moment they return: the
    deadline struck between the store's copy into the row and the composite's write-back."""

    def get_many_into_when(self, keys, outs, claims, bounce):
        loaded = super().get_many_into_when(keys, outs, claims, bounce)
        for claim in claims:
            assert claim.abandon()  # WRITTEN -> ABANDONED: vLLM may reuse the row now
        return loaded


@pytest.mark.parametrize("abandoned", [False, True], ids=["finished", "abandoned"])
def test_a_row_is_written_back_only_when_its_load_was_not_abandoned_before_the_copy(abandoned):
    local = MemoryStore(1 << 20)
    shared = _AbandonedOnReturn() if abandoned else FakeRemoteStore()
    store = LocalThenShared(local, shared)
    for n in (1, 2):
        shared.put_from_another_replica(key_of(n), payload_of(n))
    rows = [memoryview(bytearray(PAYLOAD_BYTES)) for _ in range(2)]
    loads = [AbandonableLoad(), AbandonableLoad()]
    bounce = memoryview(bytearray(PAYLOAD_BYTES))
    assert store.get_many_into_when([key_of(1), key_of(2)], rows, loads, bounce) == [True] * 2
    store.wait_write_back()
    # An abandoned load's row may hold another block's bytes by the time it is copied: never
    # stored under this key.
    assert local.contains(key_of(1)) is not abandoned and store.written_back == 2 * (not abandoned)
    store.close()


def test_require_cache_salt_keeps_unsalted_requests_off_the_shared_tier(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTIER_MASTER_KEY", "ab" * 32)
    init_none_hash(sha256)
    remote = FakeRemoteStore()
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    made = KvtierSharedTier(
        spec,
        memoryview(pool),
        "KvtierSharedTier",
        url="redis://127.0.0.1:1",
        encryption={"key_env": True, "require_cache_salt": True},
        store_factory=lambda settings, namespace: remote,
        check=lambda settings, row_bytes: None,
    )
    salted = ReqContext(req_id="s", kv_transfer_params=tagged_params(None, "tenant-a"))
    unsalted = ReqContext(req_id="u", kv_transfer_params=tagged_params(None, None))
    try:
        assert wait_until(lambda: made.lookup(key(9), salted) is not LookupResult.RETRY, 30, 0.01)
        asked = len(remote.asked)
        for ctx in (unsalted, CTX):
            assert made.lookup(key(9), ctx) is LookupResult.MISS
        assert len(remote.asked) == asked, "the server is never asked for an unsalted request"
        made.submit_store(TransferJob(1, [key(1)], np.array([0]), False, unsalted))
        made.submit_store(TransferJob(2, [key(2)], np.array([1]), False, salted))
        results: dict[int, bool] = {}
        assert wait_until(
            lambda: (
                results.update({r.job_id: r.success for r in made.get_finished_jobs()})
                or len(results) == 2
            ),
            30,
            0.01,
        )
        assert results == {1: False, 2: True}
        assert not MemoryStore.contains(remote, key(1)) and MemoryStore.contains(remote, key(2))
    finally:
        made.shutdown()


@pytest.fixture
def redis_url(tmp_path):
    from tests.support.redis_servers import server_binary, start_standalone

    if server_binary() is None:
        pytest.skip("no redis-server on PATH (run scripts/redis-server.sh)")
    server = start_standalone(tmp_path / "redis")
    yield server.url
    server.kill()


def sealed_shared_tier(tmp_path, pool, url):
    spec = stock_spec(offloading_config(tmp_path / "model", ROW_BYTES))
    return KvtierSharedTier(
        spec, memoryview(pool), "KvtierSharedTier", url=url, encryption={"key_env": True}
    )


def finish(tier, job) -> bool:
    (tier.submit_load if job.is_promotion else tier.submit_store)(job)
    results: list = []
    assert wait_until(lambda: results.extend(tier.get_finished_jobs()) or results, 30, 0.01)
    return results[0].success


def settled_lookup(tier, block, ctx) -> LookupResult:
    """The lookup's answer once the server was asked (RETRY while it is)."""
    answers: list = []
    assert wait_until(
        lambda: answers.append(tier.lookup(block, ctx)) or answers[-1] is not LookupResult.RETRY,
        30,
        0.01,
    )
    return answers[-1]


def test_a_replica_asks_the_server_for_each_tenants_blocks_under_its_own_names(
    tmp_path, monkeypatch, redis_url
):
    monkeypatch.setenv("KVTIER_MASTER_KEY", "cd" * 32)
    init_none_hash(sha256)
    alice = ReqContext(req_id="a", kv_transfer_params=tagged_params(None, "tenant-a"))
    bob = ReqContext(req_id="b", kv_transfer_params=tagged_params(None, "tenant-b"))
    pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    writer = sealed_shared_tier(tmp_path, pool, redis_url)
    try:
        assert settled_lookup(writer, key(9), alice) is LookupResult.MISS
        pool[0] = np.arange(ROW_BYTES) % 113
        assert finish(writer, TransferJob(1, [key(1)], np.array([0]), False, alice))
    finally:
        writer.shutdown()
    other_pool = np.zeros((ROWS, ROW_BYTES), dtype=np.int8)
    reader = sealed_shared_tier(tmp_path, other_pool, redis_url)
    try:
        assert settled_lookup(reader, key(1), bob) is LookupResult.MISS
        assert settled_lookup(reader, key(1), CTX) is LookupResult.MISS, "nor unsalted"
        assert settled_lookup(reader, key(1), alice) is LookupResult.HIT
        assert finish(reader, TransferJob(2, [key(1)], np.array([3]), True, alice))
        assert np.array_equal(other_pool[3], pool[0])
    finally:
        reader.shutdown()


class _NeverAdmits:
    """A write admission that would skip every store (no restore could pay here)."""

    def admit(self) -> bool:
        return False

    def note_restore(self) -> None:
        pass


@pytest.mark.parametrize("behind_a_disk", [False, True])
def test_stores_with_a_part_on_a_server_are_written_whatever_this_engine_could_restore(
    tmp_path, behind_a_disk
):
    """The write admission skips only where this host alone reads the records: a server's
    readers are other machines, whose prefill this engine's policy does not know."""
    server = FakeRemoteStore()
    local = MemoryStore(1 << 20)
    store = LocalThenShared(local, server) if behind_a_disk else server
    made = bounded_tier(tmp_path, store)
    try:
        assert wait_until(lambda: made.store is not None, 30, 0.01), "the store never opened"
        made.decider.writes = _NeverAdmits()
        made.submit_store(TransferJob(1, [key(1)], np.array([0]), False, CTX))
        made.drain_jobs()
        assert [r.success for r in made.get_finished_jobs()] == [True]
        assert server.contains(key(1)) and made.counters.stores_skipped == 0
        assert local.contains(key(1)) is behind_a_disk
    finally:
        made.shutdown()
