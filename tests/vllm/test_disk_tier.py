"""KvtierDiskTier against a fake host pool: the SecondaryTierManager contract, no engine."""

import os
import threading
import time

import numpy as np
import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import TransferJob

from kvtier.dataplane.abandonable import AbandonableLoad, LoadState
from kvtier.errors import ConfigError
from kvtier.runtime.opener import HOUSEKEEPING_INTERVAL_S
from kvtier.runtime.row_io import ClaimForBuffer
from kvtier.store import DiskStore, MemoryStore, RecordIO, RecordWriter
from kvtier.vllm.disk_tier import KvtierDiskTier
from tests.support import store as stores
from tests.support.tiers import finish_job, stock_spec
from tests.support.tiers import offloading_config as tier_config

ROWS, ROW_BYTES = 8, 8192
CTX = ReqContext(req_id="r")


def offloading_config(model_dir):
    return tier_config(model_dir, ROW_BYTES)


@pytest.fixture
def pool():
    return np.zeros((ROWS, ROW_BYTES), dtype=np.int8)


@pytest.fixture
def tier(tmp_path, pool):
    init_none_hash(sha256)
    spec = stock_spec(offloading_config(tmp_path / "model"))
    made = KvtierDiskTier(
        spec,
        memoryview(pool),
        "KvtierDiskTier",
        root_dir=str(tmp_path / "disk"),
        capacity_bytes="16MiB",
    )
    yield made
    made.shutdown()


def key(i: int) -> bytes:
    return bytes([i]) * 32 + (0).to_bytes(4, "big")


def run(tier, job_id, keys, rows, is_promotion):
    return finish_job(tier, job_id, keys, rows, is_promotion, CTX)


def wait_open(tier):
    deadline = time.monotonic() + 30
    while tier.lookup(key(99), CTX) is LookupResult.RETRY:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_stored_rows_load_back_into_other_rows(tier, pool):
    wait_open(tier)
    pool[0] = np.arange(ROW_BYTES) % 127
    pool[1] = -5
    assert run(tier, 1, [key(1), key(2)], [0, 1], False).success
    assert tier.lookup(key(1), CTX) is LookupResult.HIT
    result = run(tier, 2, [key(1), key(2)], [5, 6], True)
    assert result.success and result.transfer_bytes == 2 * ROW_BYTES
    assert np.array_equal(pool[5], pool[0]) and np.array_equal(pool[6], pool[1])


def test_lookup_retries_until_the_store_is_open_then_misses(tmp_path, pool):
    init_none_hash(sha256)
    spec = stock_spec(offloading_config(tmp_path / "model"))
    tier = KvtierDiskTier(
        spec, memoryview(pool), "t", root_dir=str(tmp_path / "d"), capacity_bytes="16MiB"
    )
    try:
        seen = set()
        deadline = time.monotonic() + 30
        while (answer := tier.lookup(key(3), CTX)) is LookupResult.RETRY:
            seen.add(answer)
            assert time.monotonic() < deadline
        assert answer is LookupResult.MISS
    finally:
        tier.shutdown()


def test_a_corrupt_block_is_a_partial_failure_and_then_a_miss(tier, pool):
    wait_open(tier)
    pool[0], pool[1] = 1, 2
    run(tier, 1, [key(1), key(2)], [0, 1], False)
    store = tier._wait_store()
    path = store.record_path(key(2))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    result = run(tier, 2, [key(1), key(2)], [4, 5], True)
    assert not result.success
    assert list(result.successful_keys) == [key(1)]
    assert tier.lookup(key(2), CTX) is LookupResult.MISS, "no request may re-promote it"
    assert tier.lookup(key(1), CTX) is LookupResult.HIT


def test_a_deleted_block_is_a_miss_after_its_failed_load(tier, pool):
    wait_open(tier)
    run(tier, 1, [key(7)], [0], False)
    tier._wait_store().record_path(key(7)).unlink()
    assert tier.lookup(key(7), CTX) is LookupResult.HIT  # the index still believes it
    assert not run(tier, 2, [key(7)], [3], True).success
    assert tier.lookup(key(7), CTX) is LookupResult.MISS


def test_store_of_a_block_already_on_disk_is_not_rewritten(tier, pool):
    wait_open(tier)
    run(tier, 1, [key(1)], [0], False)
    puts = tier._wait_store().stats().puts
    assert run(tier, 2, [key(1)], [0], False).success
    assert tier._wait_store().stats().puts == puts


def test_drain_waits_for_every_job_and_pending_work_is_reported(tier, pool):
    wait_open(tier)
    job = TransferJob(1, [key(i) for i in range(5)], np.arange(5, dtype=np.int32), False, CTX)
    tier.submit_store(job)
    assert tier.has_pending_work()
    tier.drain_jobs()
    (result,) = tier.get_finished_jobs()
    assert result.success
    assert not tier.has_pending_work()


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"fsync": "sometimes"}, r"fsync \(fsync / --fsync\)='sometimes'.*'never'"),
        ({"io_threads": 0}, r"io_threads \(disk_threads / --disk-threads\)=0"),
        ({"capacity_bytes": "lots"}, r"capacity_bytes \(disk_capacity / --disk-capacity\)"),
        ({"colour": "blue"}, r"unknown disk tier option\(s\) \['colour'\]; known: \["),
    ],
)
def test_bad_options_refuse_start_up_naming_the_option(tmp_path, pool, options, match):
    spec = stock_spec(offloading_config(tmp_path / "model"))
    with pytest.raises(ConfigError, match=match):
        KvtierDiskTier(spec, memoryview(pool), "t", root_dir=str(tmp_path / "d"), **options)
    assert not (tmp_path / "d").exists(), "a refused start-up leaves no folder behind"


def test_an_unusable_root_refuses_start_up_naming_disk_dir(tmp_path, pool):
    root = tmp_path / "file"
    root.write_text("not a folder")
    spec = stock_spec(offloading_config(tmp_path / "model"))
    with pytest.raises(ConfigError, match="disk_dir"):
        KvtierDiskTier(spec, memoryview(pool), "t", root_dir=str(root), capacity_bytes="16MiB")
    assert root.read_text() == "not a folder"


def test_a_cap_the_store_cannot_open_refuses_start_up_not_the_opener_thread(tmp_path, pool):
    """A cap above the old settings minimum (4 KiB) but too small for the store's index:
    the tier must refuse in its constructor, naming the option, instead of starting and
    missing every lookup after its opener thread fails ("fail-open")."""
    init_none_hash(sha256)
    spec = stock_spec(offloading_config(tmp_path / "model"))
    made = None
    try:
        option = r"capacity_bytes \(disk_capacity / --disk-capacity\)"
        with pytest.raises(ConfigError, match=option):
            made = KvtierDiskTier(
                spec, memoryview(pool), "t", root_dir=str(tmp_path / "d"), capacity_bytes="512KiB"
            )
    finally:
        if made is not None:  # before the fix: started; its store then failed to open
            wait_open(made)
            failures = made.counters.open_failures
            made.shutdown()
            assert failures == 0, "the tier started and its store failed to open later"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FailingReads(MemoryStore):
    """A MemoryStore whose reads fail while ``failing`` (an I/O error that keeps the record)."""

    failing = False

    def get_into(self, key, out):
        return False if self.failing else super().get_into(key, out)


def test_a_failed_key_is_a_miss_until_its_negative_entry_expires(tmp_path, pool):
    """A store that keeps the record and a fake clock: the negative cache expires."""
    init_none_hash(sha256)
    clock = FakeClock()
    stores: list[FailingReads] = []

    def memory_store(settings, namespace):
        stores.append(FailingReads(1 << 20))
        return stores[-1]

    spec = stock_spec(offloading_config(tmp_path / "model"))
    tier = KvtierDiskTier(
        spec,
        memoryview(pool),
        "t",
        root_dir=str(tmp_path / "d"),
        store_factory=memory_store,
        clock=clock,
        negative_ttl_s=60.0,
    )
    try:
        wait_open(tier)
        pool[0] = 9
        assert run(tier, 1, [key(4)], [0], False).success
        (store,) = stores
        store.failing = True
        assert not run(tier, 2, [key(4)], [3], True).success
        store.failing = False
        assert tier.lookup(key(4), CTX) is LookupResult.MISS
        clock.now += 59.0
        assert tier.lookup(key(4), CTX) is LookupResult.MISS, "still inside its TTL"
        clock.now += 2.0
        assert tier.lookup(key(4), CTX) is LookupResult.HIT, "offered again once expired"
        assert tier.counters.load_failures == 1
    finally:
        tier.shutdown()


def test_a_block_stored_again_after_a_failed_load_is_served_again(tier, pool):
    wait_open(tier)
    run(tier, 1, [key(8)], [0], False)
    tier._wait_store().record_path(key(8)).unlink()
    assert not run(tier, 2, [key(8)], [3], True).success
    assert tier.lookup(key(8), CTX) is LookupResult.MISS
    assert run(tier, 3, [key(8)], [0], False).success
    assert tier.lookup(key(8), CTX) is LookupResult.HIT


def test_a_tier_sees_blocks_another_tier_on_the_same_folder_stores(tier, tmp_path, pool):
    """Two engines sharing a disk folder: each picks up the other's blocks while running."""
    other_pool = np.zeros_like(pool)
    spec = stock_spec(offloading_config(tmp_path / "model"))
    other = KvtierDiskTier(
        spec, memoryview(other_pool), "t", root_dir=str(tmp_path / "disk"), capacity_bytes="16MiB"
    )
    try:
        wait_open(tier)
        wait_open(other)
        assert other.lookup(key(7), CTX) is LookupResult.MISS
        pool[2] = 42
        assert run(tier, 1, [key(7)], [2], False).success
        deadline = time.monotonic() + 10 * HOUSEKEEPING_INTERVAL_S + 5
        while other.lookup(key(7), CTX) is not LookupResult.HIT:
            assert time.monotonic() < deadline, "the other tier never saw the stored block"
            time.sleep(0.05)
        assert run(other, 2, [key(7)], [4], True).success
        assert (other_pool[4] == 42).all()
    finally:
        other.shutdown()


def test_tier_metrics_report_what_changed_since_the_last_call(tier, pool):
    from kvtier.vllm import metrics

    definitions = KvtierDiskTier.build_metric_definitions({})
    assert metrics.STORED in definitions and metrics.QUARANTINED in definitions
    wait_open(tier)
    tier.get_stats()  # whatever start-up reported
    pool[0], pool[1] = 1, 2
    assert run(tier, 1, [key(1), key(2)], [0, 1], False).success
    path = tier._wait_store().record_path(key(2))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    run(tier, 2, [key(1), key(2)], [4, 5], True)
    counters = tier.get_stats().data["data"]
    assert counters[metrics.STORED] == {("disk",): 2}
    assert counters[metrics.LOADED] == {("disk",): 1}
    assert counters[metrics.LOAD_FAILURES] == {("disk",): 1}
    assert counters[metrics.QUARANTINED] == {("disk", "checksum"): 1}
    again = tier.get_stats()
    assert again is None or metrics.STORED not in again.data["data"], "counters are deltas"


def test_a_load_the_page_cache_held_is_counted_as_such(tier, pool):
    """Records go to disk O_DIRECT, so only one rewritten through the page cache (as a copy of
    the folder would) is read from it, and the metric says so."""
    from kvtier import native
    from kvtier.vllm import metrics

    if native.record_reader() is None:
        pytest.skip("kvtier.native._recordread is not built: the Python steps read O_DIRECT")
    wait_open(tier)
    pool[0], pool[1] = 3, 4
    assert run(tier, 1, [key(1), key(2)], [0, 1], False).success
    cached = tier._wait_store().record_path(key(2))
    cached.write_bytes(cached.read_bytes())  # the same bytes, now in the page cache
    cold = tier._wait_store().record_path(key(1))
    fd = os.open(cold, os.O_RDONLY)
    try:  # rows this small are written buffered: drop the other record's clean pages
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    if not native.resident(cached) or native.resident(cold):
        pytest.skip("this file system keeps records in the page cache either way (or not at all)")
    tier.get_stats()
    assert run(tier, 2, [key(1), key(2)], [4, 5], True).success
    assert (pool[4] == 3).all() and (pool[5] == 4).all()
    counters = tier.get_stats().data["data"]
    assert counters[metrics.LOADED] == {("disk",): 2}
    assert counters[metrics.PAGE_CACHE_READS] == {("disk",): 1}


class StallingStore(MemoryStore):
    """A MemoryStore whose loads hang until released (a stalled disk)."""

    def __init__(self) -> None:
        super().__init__(1 << 20)
        self.release = threading.Event()
        self.reading = threading.Event()

    def get_into(self, key, out):
        self.reading.set()
        self.release.wait(30)
        return super().get_into(key, out)


def test_a_load_past_its_deadline_is_abandoned_and_never_writes_its_row(tmp_path, pool):
    init_none_hash(sha256)
    clock = FakeClock()
    stalling = StallingStore()
    spec = stock_spec(offloading_config(tmp_path / "model"))
    tier = KvtierDiskTier(
        spec,
        memoryview(pool),
        "t",
        root_dir=str(tmp_path / "d"),
        store_factory=lambda settings, namespace: stalling,
        clock=clock,
        load_deadline_s=lambda nbytes: 2.0,
    )
    try:
        wait_open(tier)
        pool[0] = 7
        assert run(tier, 1, [key(3)], [0], False).success
        job = TransferJob(2, [key(3)], np.array([5], dtype=np.int32), True, CTX)
        tier.submit_load(job)
        assert stalling.reading.wait(10)
        assert list(tier.get_finished_jobs()) == [], "still inside its deadline"
        clock.now += 2.5
        (result,) = tier.get_finished_jobs()
        assert not result.success and not result.successful_keys
        assert tier.counters.loads_abandoned == 1
        assert tier.counters.loads_stuck == 1, "the stuck read still holds its thread"
        assert tier.lookup(key(3), CTX) is LookupResult.MISS, "a slow tier is skipped"
        pool[5] = 11  # vLLM reuses the row for another block
        stalling.release.set()
        deadline = time.monotonic() + 10
        while tier.counters.loads_stuck and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tier.counters.loads_stuck == 0, "the read returned: its thread is free again"
        tier.shutdown()  # joins the I/O threads: the late read has returned
        assert (pool[5] == 11).all(), "the late read overwrote a reused row"
    finally:
        stalling.release.set()
        tier.shutdown()


class StallsOnOneKey(MemoryStore):
    """A MemoryStore whose load of one key hangs until released; the others load at once."""

    def __init__(self, stalled: bytes) -> None:
        super().__init__(1 << 20)
        self.stalled = stalled
        self.release = threading.Event()
        self.reading = threading.Event()

    def get_into(self, key, out):
        if key == self.stalled:
            self.reading.set()
            self.release.wait(30)
        return super().get_into(key, out)


def test_a_share_stalled_after_loading_a_block_is_reported_at_its_deadline(tmp_path, pool):
    """One read thread loads the job's blocks in turn: the first is written into its row, the
    second stalls. At the deadline the job is reported all the same (the written block, not
    yet reported, as failed) and the stalled read never writes its row."""
    init_none_hash(sha256)
    clock = FakeClock()
    store = StallsOnOneKey(key(4))
    spec = stock_spec(offloading_config(tmp_path / "model"))
    tier = KvtierDiskTier(
        spec,
        memoryview(pool),
        "t",
        root_dir=str(tmp_path / "d"),
        io_threads=1,
        store_factory=lambda settings, namespace: store,
        clock=clock,
        load_deadline_s=lambda nbytes: 2.0,
    )
    try:
        wait_open(tier)
        pool[0], pool[1] = 7, 8
        assert run(tier, 1, [key(3), key(4)], [0, 1], False).success
        tier.submit_load(TransferJob(2, [key(3), key(4)], np.array([5, 6], np.int32), True, CTX))
        assert store.reading.wait(10)
        assert (pool[5] == 7).all(), "the first block was loaded before the stall"
        clock.now += 2.5
        (result,) = tier.get_finished_jobs()
        assert not result.success and not result.successful_keys
        pool[6] = 11  # vLLM reuses the rows
        store.release.set()
        tier.shutdown()
        assert (pool[6] == 11).all(), "the late read overwrote a reused row"
    finally:
        store.release.set()
        tier.shutdown()


@pytest.mark.parametrize("row", [ROWS, ROWS + 3, -1])
def test_a_store_from_a_row_outside_the_pool_fails_and_writes_nothing(tier, pool, row):
    wait_open(tier)
    assert not run(tier, 1, [key(4)], [row], False).success
    assert tier.lookup(key(4), CTX) is LookupResult.MISS
    store = tier._wait_store()
    assert list(store.keys()) == [] and store.stats().puts == 0
    pool[2] = 9
    assert run(tier, 2, [key(4)], [2], False).success, "the key's next good store is kept"
    assert run(tier, 3, [key(4)], [5], True).success
    assert np.array_equal(pool[5], pool[2])


def test_a_record_that_can_never_load_is_dropped_and_stored_again(tmp_path, pool):
    """A record of another length than a row (written by whatever) leaves the store at its
    failed load, so the key's next good store is kept, not skipped as already there."""
    init_none_hash(sha256)
    stores: list[MemoryStore] = []

    def memory_store(settings, namespace):
        stores.append(MemoryStore(1 << 20))
        return stores[-1]

    spec = stock_spec(offloading_config(tmp_path / "model"))
    tier = KvtierDiskTier(
        spec, memoryview(pool), "t", root_dir=str(tmp_path / "d"), store_factory=memory_store
    )
    try:
        wait_open(tier)
        (store,) = stores
        assert store.put(key(6), b"short")
        assert not run(tier, 1, [key(6)], [3], True).success
        assert not store.contains(key(6))
        pool[0] = 7
        assert run(tier, 2, [key(6)], [0], False).success
        assert store.get(key(6)) == bytes(pool[0])
    finally:
        tier.shutdown()


class StalledWrites(MemoryStore):
    """A MemoryStore whose puts hang until released (a stalled disk)."""

    def __init__(self) -> None:
        super().__init__(1 << 20)
        self.release = threading.Event()

    def put(self, key, payload):
        self.release.wait(60)
        return super().put(key, payload)


def test_shutdown_behind_a_stalled_disk_returns_within_its_drain_deadline(tmp_path, pool):
    init_none_hash(sha256)
    stalled = StalledWrites()
    spec = stock_spec(offloading_config(tmp_path / "model"))
    tier = KvtierDiskTier(
        spec,
        memoryview(pool),
        "t",
        root_dir=str(tmp_path / "d"),
        io_threads=2,
        drain_deadline_s=0.5,
        store_factory=lambda settings, namespace: stalled,
    )
    try:
        wait_open(tier)
        # The first two jobs, one store task each (one batch holds them), stall both threads
        # in a put; the third job's task waits behind them.
        quarter, half = ROWS // 4, ROWS // 2
        for job, first, count in ((1, 0, quarter), (2, quarter, quarter), (3, half, half)):
            keys = [key(i) for i in range(first, first + count)]
            rows = np.arange(first, first + count, dtype=np.int32)
            tier.submit_store(TransferJob(job, keys, rows, False, CTX))
        started = time.monotonic()
        tier.shutdown()
        took = time.monotonic() - started
        assert 0.4 <= took < 3.0, f"shutdown took {took:.1f} s with a 0.5 s drain deadline"
        assert tier.counters.stuck_at_shutdown == 2, "both I/O threads are stuck in a put"
        assert tier.counters.dropped_at_shutdown == half, "the queued job's blocks are dropped"
    finally:
        stalled.release.set()


@pytest.mark.parametrize("resident", [True, False])
def test_a_read_into_a_record_buffer_leaves_the_load_claimed_until_its_row_is_written(
    tmp_path, resident
):
    """Rows gathered from slices are read into the thread's record buffer and then scattered
    into the row: the store may claim the load, but only the scatter may mark it written
    (a written load may be abandoned, and its row reused, at once)."""
    io = RecordIO(
        RecordWriter(fsync="data", direct_writes=not resident, drop_written_pages=not resident)
    )
    store = DiskStore(
        tmp_path, stores.make_namespace(), stores.disk_capacity(4), free_space_floor_bytes=0, io=io
    )
    try:
        assert store.put(stores.key_of(1), stores.payload_of(1))
        load = AbandonableLoad()
        record, bounce = (stores.aligned_buffer(stores.PAYLOAD_BYTES) for _ in range(2))
        assert store.get_into_when(stores.key_of(1), record, ClaimForBuffer(load), bounce)
        assert bytes(record) == stores.payload_of(1)
        assert load.state is LoadState.COPYING
        assert not load.abandon(), "claimed, row not written yet: not abandoned"
    finally:
        store.close()


def test_stores_no_restore_could_pay_for_are_skipped_and_counted(tier, pool):
    """A disk the engine's prefill beats at every prompt length it takes: store jobs finish
    failed with nothing written (kvtier.policy.write_admission), one a probe interval aside."""
    from kvtier.policy.write_admission import WriteAdmission
    from kvtier.vllm import metrics

    wait_open(tier)
    policy = tier.decider.policy
    clock = [1000.0]
    writes = WriteAdmission(policy, "disk", 4096, 16, ROW_BYTES, lambda: clock[0])
    tier.decider.writes = writes  # the seam: this engine's longest prompt, 4,096 tokens
    assert run(tier, 1, [key(1)], [0], False).success, "nothing measured yet: written"
    for tokens in (256, 512, 1024, 2048, 4096):
        policy.observe_prefill([(0, tokens)], tokens * 1e-6)  # 1 us a token
    policy.observe_load("disk", ROW_BYTES, 0.05)  # 8 KiB in 50 ms
    assert policy.restore_never_pays("disk", 4096, 16, ROW_BYTES)
    assert run(tier, 2, [key(2)], [1], False).success, "the sample of its probe interval"
    skipped = run(tier, 3, [key(3), key(4)], [2, 3], False)
    assert not skipped.success
    assert tier.lookup(key(3), CTX) is LookupResult.MISS
    assert tier.counters.stores_skipped == 2 and tier.counters.stores == 2
    counters = metrics.snapshot("disk", [], tier.counters, {}).counters
    assert counters[(metrics.STORES_SKIPPED, ("disk",))] == 2
    clock[0] += policy.settings.probe_interval_s
    assert run(tier, 4, [key(5)], [4], False).success, "the next interval's sample"
    writes.note_restore()
    assert run(tier, 5, [key(6)], [5], False).success, "a restore verdict: every store again"


def test_a_fresh_tier_is_probed_on_its_first_record_not_an_interval_later(tier, pool):
    """The housekeeping's probe of a never-measured tier waits for a record to read instead
    of claiming the probe on an empty store (which put the first measurement, and with it
    the write admission, a probe interval late)."""
    wait_open(tier)
    policy = tier.decider.policy
    store = tier._wait_store()
    tier._measure_idle_tier(store)  # nothing stored yet: no probe claimed
    run(tier, 1, [key(1)], [0], False)
    tier._measure_idle_tier(store)
    # Half a probe interval: ample for one read, short of the next claim of a wasted probe.
    deadline = time.monotonic() + policy.settings.probe_interval_s / 2
    while policy.snapshot().tiers["disk"].loads == 0:
        assert time.monotonic() < deadline, "the first record was not probed at once"
        time.sleep(0.01)
