"""The tier's collaborators on their own, without vLLM: stats, health, prober, job table."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import threading
import time

import pytest

from kvtier.dataplane.abandonable import AbandonableLoad
from kvtier.runtime.health import NEGATIVE_TTL_S, SLOW_BACKOFF_S, TierHealth
from kvtier.runtime.jobs import STORE_BATCH_BLOCKS, JobTable, StoresQueued
from kvtier.runtime.prober import ABSENT_TTL_S, ExistenceProber
from kvtier.runtime.row_io import RowIO
from kvtier.runtime.row_layout import RowLayout
from kvtier.runtime.stats import TierCounters, TierStats
from kvtier.runtime.tenants import TenantViews
from kvtier.store import MemoryStore
from tests.support.waiting import wait_until


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def key(i: int) -> bytes:
    return i.to_bytes(4, "big") * 8


# -- tier_stats ---------------------------------------------------------------------------
@pytest.fixture
def frequent_thread_switches():
    """Switch threads every microsecond, so an unlocked read-add-write loses increments."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


def test_counters_bumped_from_many_threads_lose_no_increment(frequent_thread_switches):
    stats = TierStats()
    threads, rounds = 8, 5_000
    start = threading.Barrier(threads)

    def bump() -> None:
        start.wait()
        for _ in range(rounds):
            stats.stored(0.5, ok=True)
            stats.stored(0.25, ok=False)
            stats.loaded(0.125)
            stats.load_failed()
            stats.abandoned(2)
            stats.dropped(3)
            stats.dropped_server_part(5)

    workers = [threading.Thread(target=bump) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    n = threads * rounds
    assert stats.snapshot() == TierCounters(
        stores=n,
        write_seconds=n * 0.75,
        loads=n,
        read_seconds=n * 0.125,
        load_failures=n,
        loads_abandoned=2 * n,
        stores_dropped=3 * n,
        server_stores_dropped=5 * n,
    )


def test_a_snapshot_does_not_change_with_later_bumps():
    stats = TierStats()
    stats.open_failed()
    before = stats.snapshot()
    stats.open_failed()
    assert before.open_failures == 1 and stats.snapshot().open_failures == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.open_failures = 5  # type: ignore[misc]


# -- tier_health --------------------------------------------------------------------------
def test_a_failed_key_misses_until_its_ttl_or_a_good_store():
    clock = FakeClock()
    health = TierHealth(clock, negative_ttl_s=60.0)
    health.load_failed([key(1), key(2)])
    assert health.recently_failed(key(1)) and health.recently_failed(key(2))
    assert not health.recently_failed(key(3))
    health.stored(key(2))
    assert not health.recently_failed(key(2)), "a good copy lifts it at once"
    clock.now += 59.0
    assert health.recently_failed(key(1))
    clock.now += 2.0
    assert not health.recently_failed(key(1))


def test_the_default_negative_ttl_is_five_minutes():
    clock = FakeClock()
    health = TierHealth(clock)
    health.load_failed([key(1)])
    clock.now += NEGATIVE_TTL_S - 1
    assert health.recently_failed(key(1))


def test_overruns_double_the_back_off_and_a_completed_load_resets_it():
    clock = FakeClock()
    health = TierHealth(clock)
    assert not health.is_slow()
    assert health.overran([key(1)]) == SLOW_BACKOFF_S
    assert health.is_slow() and health.recently_failed(key(1))
    clock.now += SLOW_BACKOFF_S
    assert not health.is_slow()
    backoffs = [health.overran([]) for _ in range(6)]
    assert backoffs == [SLOW_BACKOFF_S * f for f in (2, 4, 8, 16, 16, 16)]
    health.load_completed()
    assert health.overran([]) == SLOW_BACKOFF_S


def test_a_callers_deadline_rule_wins_over_the_policys():
    clock = FakeClock()
    assert TierHealth(clock).deadline(8192, 3.0) == clock.now + 3.0
    explicit = TierHealth(clock, load_deadline_s=lambda nbytes: nbytes / 1024)
    assert explicit.deadline(8192, 3.0) == clock.now + 8.0


# -- tier_prober --------------------------------------------------------------------------
def test_keys_of_one_step_are_asked_in_one_batch_and_absent_ones_cached():
    clock = FakeClock()
    held = {key(1)}
    asked: list[list[bytes]] = []

    def exists_many(keys):
        asked.append(list(keys))
        return {k for k in asked[-1] if k in held}

    prober = ExistenceProber(exists_many, clock, label="t", wait_s=0.01)
    assert prober.ask(key(1)) and prober.ask(key(2)) and prober.ask(key(1))
    assert prober.run_once() == 2
    assert asked == [[key(1), key(2)]]
    assert not prober.ask(key(2)), "the server said absent: a miss without asking"
    clock.now += ABSENT_TTL_S + 0.1
    assert prober.ask(key(2)), "asked again once the answer is stale"


def test_keys_asked_through_other_stores_are_asked_of_each_in_one_batch():
    asked: dict[str, list[bytes]] = {}

    def asker(name, held):
        def exists_many(keys):
            asked[name] = list(keys)
            return {k for k in asked[name] if k in held}

        return exists_many

    alice, bob = asker("alice", {key(1)}), asker("bob", {key(3)})
    prober = ExistenceProber(asker("default", set()), FakeClock(), label="t", wait_s=0.01)
    assert prober.ask(key(1), alice) and prober.ask(key(2), alice) and prober.ask(key(3), bob)
    assert prober.ask(key(4))
    assert prober.run_once() == 4
    assert asked == {"alice": [key(1), key(2)], "bob": [key(3)], "default": [key(4)]}
    assert prober.ask(key(1), alice), "found: asked again until the store answers from memory"
    assert not prober.ask(key(2), alice) and not prober.ask(key(4))
    assert prober.ask(key(2), bob), "absent for one store, still asked of another"


# -- tenants ------------------------------------------------------------------------------
def test_tenant_views_are_made_once_per_tenant_and_the_default_tenant_gets_the_store():
    made: list[str | None] = []

    class Store:
        def tenant_view(self, sealer):
            made.append(sealer)
            return ("view", sealer)

    store = Store()
    views = TenantViews(lambda salt: f"sealer:{salt}", max_views=2)
    assert views.of(store, None) is store
    assert views.of(store, "a") == ("view", "sealer:a") and views.of(store, "a") is views.of(
        store, "a"
    )
    views.of(store, "b"), views.of(store, "c")
    assert made == ["sealer:a", "sealer:b", "sealer:c"]
    views.of(store, "a")
    assert made[-1] == "sealer:a", "the least recently used view was dropped and made again"
    other = Store()
    views.of(other, "c")
    assert made[-1] == "sealer:c", "another store (reopened) gets views of its own"
    assert TenantViews(None).of(store, "a") is store, "a plain tier: every tenant alike"


def test_a_failing_existence_check_answers_absent():
    def broken(keys):
        raise RuntimeError("bug")

    prober = ExistenceProber(broken, FakeClock(), label="t", wait_s=0.01)
    prober.ask(key(1))
    assert prober.run_once() == 1
    assert not prober.ask(key(1))


def test_the_prober_thread_answers_and_stops():
    found = threading.Event()

    def exists_many(keys):
        found.set()
        return set(keys)

    prober = ExistenceProber(exists_many, time.monotonic, label="t", wait_s=0.01)
    prober.start()
    try:
        prober.ask(key(1))
        assert found.wait(10)
    finally:
        prober.stop()


# -- tier_jobs ----------------------------------------------------------------------------
@pytest.fixture
def table():
    made = JobTable(
        thread_prefix="kvtier-test",
        io_threads=2,
        clock=FakeClock(),
        label="t",
        max_queued_blocks=2,
    )
    yield made
    made.shutdown()


def test_stores_beyond_the_bound_are_dropped_and_reported_failed(table):
    release = threading.Event()
    whole = table.submit_stores(
        1, [key(1), key(2)], [0, 1], lambda ks, rs: [release.wait(10)] * len(ks)
    )
    assert whole is StoresQueued.WHOLE
    assert table.submit_stores(2, [key(3)], [2], lambda ks, rs: [True]) is StoresQueued.DROPPED
    release.set()
    table.drain()
    outcomes = {d.job.job_id: d.outcomes for d in table.finished()}
    assert outcomes == {1: [True, True], 2: [False]}
    freed = table.submit_stores(3, [key(4), key(5)], [0, 1], lambda ks, rs: [True] * len(ks))
    assert freed is StoresQueued.WHOLE, "bound freed"


def test_stores_beyond_the_bound_run_their_over_bound_task_outside_the_bound(table):
    release, ran = threading.Event(), []

    def over_bound(ks, rs):
        ran.extend(zip(ks, rs, strict=True))
        return [True] * len(ks)

    # Both write threads held by stores within the bound (2 blocks): the over-bound ones must
    # not wait behind them.
    held = table.submit_stores(
        1, [key(1), key(2)], [0, 1], lambda ks, rs: [release.wait(30)] * len(ks)
    )
    assert held is StoresQueued.WHOLE
    queued = table.submit_stores(2, [key(3)], [2], lambda ks, rs: [False], over_bound)
    assert queued is StoresQueued.OVER_BOUND
    assert wait_until(lambda: ran == [(key(3), 2)], 5, 0.01), "waited behind the bound"
    release.set()
    table.drain()
    outcomes = {d.job.job_id: d.outcomes for d in table.finished()}
    assert outcomes == {1: [True, True], 2: [True]}
    freed = table.submit_stores(
        3, [key(4), key(5)], [0, 1], lambda ks, rs: [True] * len(ks), over_bound
    )
    assert freed is StoresQueued.WHOLE, "an over-bound task never holds the bound"


def test_the_table_is_writing_while_any_store_waits_or_runs_over_the_bound_too(table):
    """What the restore decision asks before it trusts a load measured alone
    (``RestorePolicy.add_tier(writing=...)``); loads are not writes."""
    assert not table.writing()
    release, over_release = threading.Event(), threading.Event()
    table.submit_stores(1, [key(1), key(2)], [0, 1], lambda ks, rs: [release.wait(30)] * len(ks))
    table.submit_stores(
        2, [key(3)], [2], lambda ks, rs: [False], lambda ks, rs: [over_release.wait(30)]
    )
    assert table.writing()
    release.set()
    assert wait_until(lambda: len(table.finished()) == 1, 5, 0.01)
    assert table.writing(), "the over-bound store still runs"
    over_release.set()
    assert wait_until(lambda: not table.writing(), 5, 0.01)
    table.submit_loads(3, [key(1)], [0], lambda ks, rows, loads: [True], deadline=lambda: 1e9)
    assert not table.writing()


def test_a_late_load_is_abandoned_at_its_deadline_and_never_claims_its_row():
    clock = FakeClock()
    table = JobTable(thread_prefix="kvtier-test", io_threads=1, clock=clock, label="t")
    release, started = threading.Event(), threading.Event()
    claimed: list[bool] = []

    def stalled(ks: list[bytes], rows: list[int], loads: list[AbandonableLoad]) -> list[bool]:
        started.set()
        release.wait(10)
        claimed.extend(load.claim() for load in loads)
        return claimed[-len(loads) :]

    try:
        table.submit_loads(1, [key(1)], [0], stalled, deadline=lambda: clock.now + 2.0)
        assert started.wait(10)
        assert table.finished() == [] and table.has_pending_work()
        clock.now += 2.5
        (done,) = table.finished()
        assert done.abandoned == [key(1)] and done.outcomes == [False]
        assert done.job.allowed_s == 2.0, "the overrun's log line names the time it was given"
        release.set()
    finally:
        release.set()
        table.shutdown()
    assert claimed == [False], "the late read was refused its row"


def test_a_load_is_one_task_per_read_thread_each_taking_every_nth_block(table):
    shares: list[list[bytes]] = []
    lock = threading.Lock()

    def load(ks: list[bytes], rows: list[int], loads: list[AbandonableLoad]) -> list[bool]:
        with lock:
            shares.append(ks)
        return [rows[i] != 3 for i in range(len(ks))]  # the block in row 3 fails

    table.submit_loads(1, [key(i) for i in range(5)], [0, 1, 2, 3, 4], load, deadline=lambda: 1e9)
    table.drain()
    (done,) = table.finished()
    assert sorted(shares) == [[key(0), key(2), key(4)], [key(1), key(3)]]
    assert done.outcomes == [True, True, True, False, True]


def test_a_store_is_one_task_per_write_thread_each_taking_every_nth_block():
    table = JobTable(thread_prefix="kvtier-test", io_threads=2, clock=FakeClock(), label="t")
    shares: list[list[bytes]] = []
    lock = threading.Lock()

    def store(ks: list[bytes], rows: list[int]) -> list[bool]:
        with lock:
            shares.append(ks)
        return [row != 3 for row in rows]  # the block in row 3 fails

    blocks = STORE_BATCH_BLOCKS + 3  # more than one batch holds: both threads take a share
    try:
        queued = table.submit_stores(1, [key(i) for i in range(blocks)], list(range(blocks)), store)
        assert queued is StoresQueued.WHOLE
        table.drain()
        (done,) = table.finished()
    finally:
        table.shutdown()
    assert sorted(shares) == [
        [key(i) for i in range(0, blocks, 2)],
        [key(i) for i in range(1, blocks, 2)],
    ]
    assert done.outcomes == [i != 3 for i in range(blocks)]


def store_batches(io_threads: int, jobs: list[range]) -> tuple[list[list[bool]], list[list[int]]]:
    """Each job's outcomes and the rows of every batch its store tasks took, the jobs (their
    rows) stored through a JobTable of ``io_threads`` write threads."""
    table = JobTable(
        thread_prefix="kvtier-test", io_threads=io_threads, clock=FakeClock(), label="t"
    )
    batches: list[list[int]] = []
    lock = threading.Lock()

    def store(ks: list[bytes], rows: list[int]) -> list[bool]:
        with lock:
            batches.append(rows)
        return [True] * len(ks)

    try:
        for job_id, rows in enumerate(jobs):
            table.submit_stores(job_id, [key(i) for i in rows], list(rows), store)
        table.drain()
        outcomes = [done.outcomes for done in table.finished()]
    finally:
        table.shutdown()
    return outcomes, batches


def test_a_store_one_batch_holds_is_one_task_whatever_the_threads():
    # Regression: 4 threads wrote a 5-block job in 4 batches, each costing the engine's loop
    # the same GIL hand-overs as a full one (docs/store.md, "What a put costs the engine").
    outcomes, batches = store_batches(4, [range(5), range(5, 25)])
    assert outcomes == [[True] * 5, [True] * 20]
    assert sorted(batches) == [list(range(5)), list(range(5, 25, 2)), list(range(6, 25, 2))]


def test_a_long_store_job_is_cut_into_bounded_batches_per_thread():
    blocks = 2 * STORE_BATCH_BLOCKS + 8
    outcomes, batches = store_batches(2, [range(blocks)])
    assert outcomes == [[True] * blocks]
    # Two windows: the first in two batches of every other block, the last 8 in one batch.
    assert sorted(len(b) for b in batches) == [8, STORE_BATCH_BLOCKS, STORE_BATCH_BLOCKS]
    full = [b for b in batches if len(b) == STORE_BATCH_BLOCKS]
    assert all(b == list(range(b[0], b[-1] + 1, 2)) for b in full), "every other block"
    assert [b for b in batches if len(b) == 8] == [list(range(2 * STORE_BATCH_BLOCKS, blocks))]
    assert sorted(r for b in batches for r in b) == list(range(blocks))


def test_the_bound_counts_a_shares_blocks_until_the_share_ends():
    table = JobTable(
        thread_prefix="kvtier-test", io_threads=2, clock=FakeClock(), label="t", max_queued_blocks=4
    )
    release = threading.Event()
    try:
        held = table.submit_stores(
            1, [key(i) for i in range(3)], [0, 1, 2], lambda ks, rs: [release.wait(30)] * len(ks)
        )
        assert held is StoresQueued.WHOLE
        assert table.submit_stores(2, [key(3), key(4)], [3, 4], lambda ks, rs: [True] * 2) is (
            StoresQueued.DROPPED
        ), "3 blocks wait, 2 more would pass the bound of 4"
        assert table.submit_stores(3, [key(5)], [5], lambda ks, rs: [True]) is StoresQueued.WHOLE
        release.set()
        table.drain()
        assert wait_until(lambda: not table.writing(), 5, 0.01)
        outcomes = {d.job.job_id: d.outcomes for d in table.finished()}
        assert outcomes == {1: [True] * 3, 2: [False, False], 3: [True]}
        freed = table.submit_stores(
            4, [key(i) for i in range(4)], [0, 1, 2, 3], lambda ks, rs: [True] * len(ks)
        )
        assert freed is StoresQueued.WHOLE, "every share ended: the bound is free again"
    finally:
        release.set()
        table.shutdown()


def test_store_shares_that_never_started_end_their_blocks_at_shutdown():
    table = JobTable(thread_prefix="kvtier-test", io_threads=1, clock=FakeClock(), label="t")
    release, started = threading.Event(), threading.Event()

    def stalled(ks: list[bytes], rows: list[int]) -> list[bool]:
        started.set()
        release.wait(10)
        return [True] * len(ks)

    table.submit_stores(1, [key(1)], [0], stalled)
    table.submit_stores(2, [key(2), key(3)], [1, 2], stalled)
    assert started.wait(10)
    try:
        table.shutdown(drain_deadline_s=0.1)
        assert all(f.cancelled() for f in table._jobs[2].futures)
    finally:
        release.set()
    assert table._jobs[1].futures[0].result(10) is True
    (first, second) = sorted(table.finished(), key=lambda d: d.job.job_id)
    assert first.outcomes == [True] and second.outcomes == [False, False]


def test_a_thread_held_by_a_late_share_is_counted_once_as_stuck():
    """The tier stops offering hits when every read thread is held: a share of three
    abandoned blocks holds one thread, not three."""
    clock = FakeClock()
    stats = TierStats()
    table = JobTable(thread_prefix="kvtier-test", io_threads=2, clock=clock, label="t", stats=stats)
    release, started = threading.Event(), threading.Event()

    def stalled(ks: list[bytes], rows: list[int], loads: list[AbandonableLoad]) -> list[bool]:
        if rows[0] == 0:
            started.set()
            release.wait(10)
        return [load.claim() for load in loads]

    try:
        rows = list(range(6))
        table.submit_loads(1, [key(i) for i in rows], rows, stalled, deadline=lambda: clock.now + 1)
        assert started.wait(10)
        deadline = time.monotonic() + 10
        while len([f for f in table._jobs[1].futures if f.done()]) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        clock.now += 2
        (done,) = table.finished()
        assert done.abandoned == [key(0), key(2), key(4)]
        assert done.outcomes == [False, True, False, True, False, True]
        assert stats.snapshot().loads_stuck == 1
        release.set()
        table.drain()
        deadline = time.monotonic() + 10
        while stats.snapshot().loads_stuck:
            assert time.monotonic() < deadline
            time.sleep(0.01)
    finally:
        release.set()
        table.shutdown()


def test_a_share_stalled_after_writing_a_block_is_still_abandoned_at_its_deadline():
    """The share wrote its first block (written: the row will not change) and stalls on its
    second: at the deadline both are abandoned and the job reported. A block it is done with
    must not keep the whole job waiting for the stalled read."""
    clock = FakeClock()
    table = JobTable(thread_prefix="kvtier-test", io_threads=1, clock=clock, label="t")
    release, stalled = threading.Event(), threading.Event()

    def load(ks: list[bytes], rows: list[int], loads: list[AbandonableLoad]) -> list[bool]:
        assert loads[0].claim()
        loads[0].written()
        stalled.set()
        release.wait(10)
        return [True, loads[1].claim()]

    try:
        table.submit_loads(1, [key(1), key(2)], [0, 1], load, deadline=lambda: clock.now + 1)
        assert stalled.wait(10)
        clock.now += 2
        (done,) = table.finished()
        assert done.abandoned == [key(1), key(2)] and done.outcomes == [False, False]
    finally:
        release.set()
        table.shutdown()


def test_shares_that_never_started_end_their_blocks_at_shutdown():
    """Shutdown cancels queued shares; their blocks must end too, or a drain would wait
    for them for ever."""
    table = JobTable(thread_prefix="kvtier-test", io_threads=1, clock=FakeClock(), label="t")
    release, started = threading.Event(), threading.Event()

    def stalled(ks: list[bytes], rows: list[int], loads: list[AbandonableLoad]) -> list[bool]:
        started.set()
        release.wait(10)
        return [load.claim() for load in loads]

    table.submit_loads(1, [key(1)], [0], stalled, deadline=lambda: 1e9)
    table.submit_loads(2, [key(2), key(3)], [1, 2], stalled, deadline=lambda: 1e9)
    assert started.wait(10)
    try:
        table.shutdown(drain_deadline_s=0.1)
        assert all(f.cancelled() for f in table._jobs[2].futures)
    finally:
        release.set()
    table._jobs[1].futures[0].result(10)
    assert all(f.done() for job in table._jobs.values() for f in job.futures)


def test_a_task_that_raises_is_a_failed_block(table):
    def broken(ks: list[bytes], rows: list[int]) -> list[bool]:
        raise OSError("bug")

    table.submit_stores(1, [key(1)], [0], broken)
    table.drain()
    (done,) = table.finished()
    assert done.outcomes == [False] and not table.has_pending_work()


class BatchRecordingStore(MemoryStore):
    """A memory store that records what each ``put_many`` was given (copies)."""

    def __init__(self) -> None:
        super().__init__(capacity_bytes=1 << 20)
        self.batches: list[dict[bytes, bytes]] = []

    def put_many(self, keys, payloads):
        self.batches.append({k: bytes(p) for k, p in zip(keys, payloads, strict=True)})
        return super().put_many(keys, payloads)


def row_io_over(pool: bytearray, row_bytes: int, layout: RowLayout) -> tuple[RowIO, TierStats]:
    stats = TierStats()
    io = RowIO(
        memoryview(pool),
        row_bytes,
        layout,
        wait_store=lambda: None,
        stats=stats,
        health=TierHealth(FakeClock()),
        label="t",
    )
    return io, stats


def test_a_store_share_is_written_in_bounded_batches_of_gathered_records():
    """Each record of a batch is gathered into a buffer of its own: one buffer for the batch
    would hand ``put_many`` the last row's slices for every block."""
    layout = RowLayout(4, (0, 0, 1, 1), ("a", "b"))  # record: part 0 and part 2 of the row
    rows = STORE_BATCH_BLOCKS + 4
    pool = bytearray(b"".join(bytes([r]) * 8 + bytes([r + 100]) * 8 for r in range(rows)))
    io, stats = row_io_over(pool, 16, layout)
    store = BatchRecordingStore()
    keys = [key(r) for r in range(rows)]
    assert io.store_many(store, keys, list(range(rows))) == [True] * rows
    assert [len(b) for b in store.batches] == [STORE_BATCH_BLOCKS, 4]
    for r in range(rows):
        assert store.get(key(r)) == bytes([r]) * 4 + bytes([r + 100]) * 4
    assert stats.snapshot().stores == rows


def test_a_store_share_skips_records_already_stored_and_replaces_other_lengths():
    layout = RowLayout(8, (0,), ("all",))
    pool = bytearray(b"".join(bytes([r + 1]) * 8 for r in range(3)))
    io, stats = row_io_over(pool, 8, layout)
    store = BatchRecordingStore()
    store.put(key(0), bytes(8))  # this length: kept as it is
    store.put(key(1), bytes(4))  # another length: can never load, replaced
    assert io.store_many(store, [key(0), key(1), key(2)], [0, 1, 2]) == [True] * 3
    assert [sorted(b) for b in store.batches] == [[key(1), key(2)]]
    assert store.get(key(0)) == bytes(8) and store.get(key(1)) == bytes([2]) * 8
    assert stats.snapshot().stores == 3


def test_the_collaborators_import_neither_vllm_nor_torch():
    """Only the adapter (``store_tier``) meets vLLM, so a version seam touches it alone."""
    code = (
        "import sys\n"
        "import kvtier.runtime.jobs, kvtier.runtime.opener, kvtier.runtime.prober\n"
        "import kvtier.runtime.health, kvtier.runtime.stats\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]", out
