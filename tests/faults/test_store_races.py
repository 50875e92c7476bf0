"""Garbage collection racing loads, and ``verify`` racing writers, across processes.

Writer processes (``workers.write_forever``) fill a small shared store, so every put evicts;
meanwhile this process loads from its own view of the store on several threads (its view goes
stale between refreshes, so many loads hit records another process has just evicted), or runs
``verify`` over the folder. An evicted record must be a clean miss (never a "corrupt" one,
never quarantined), every hit must be the whole payload of its key, and a check that runs
while others write must not report problems that are only writes or evictions in flight.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter

import pytest

from kvtier.store.disk.quarantine import entries
from tests.support.faults import (
    FUZZ_KEYS,
    FUZZ_PAYLOAD,
    check_after_crashes,
    forkserver,
    fuzz_key,
    open_fuzz_store,
    payload_ok,
)
from tests.support.store import aligned_buffer
from tests.support.workers import write_forever

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]


class Writers:
    """``count`` writer processes on ``root`` until ``stop()`` SIGKILLs them."""

    def __init__(self, root, count: int, seed: int) -> None:  # type: ignore[no-untyped-def]
        ctx = forkserver()
        self.processes = [
            ctx.Process(target=write_forever, args=(str(root), seed + n)) for n in range(count)
        ]
        for p in self.processes:
            p.start()

    def stop(self) -> None:
        for p in self.processes:
            p.kill()
            p.join(60)
        assert all(p.exitcode == -9 for p in self.processes), [p.exitcode for p in self.processes]


def load_loop(store, stop: threading.Event, seen: Counter[str], seed: int) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    buffers = [aligned_buffer(FUZZ_PAYLOAD), memoryview(bytearray(FUZZ_PAYLOAD))]
    while not stop.is_set():
        i = rng.randrange(FUZZ_KEYS)
        out = rng.choice(buffers)
        if store.get_into(fuzz_key(i), out):
            seen["hit"] += 1
            if not payload_ok(i, out):
                seen["wrong"] += 1
        else:
            seen["miss"] += 1
        if rng.random() < 0.05:
            seen["refreshed"] += store.refresh()


@pytest.mark.parametrize(
    "seconds", [pytest.param(4, id="4s"), pytest.param(45, id="45s", marks=pytest.mark.slow)]
)
def test_eviction_by_other_processes_racing_loads_is_a_clean_miss(
    outside, reliability, seconds: float
) -> None:
    with open_fuzz_store(outside.cache) as store:
        writers = Writers(outside.cache, 2, seed=7)
        stop = threading.Event()
        seen: Counter[str] = Counter()
        loaders = [
            threading.Thread(target=load_loop, args=(store, stop, seen, n)) for n in range(3)
        ]
        try:
            for t in loaders:
                t.start()
            time.sleep(seconds)
        finally:
            stop.set()
            for t in loaders:
                t.join(60)
            writers.stop()
        assert seen["wrong"] == 0, "a load returned bytes that are not its key's payload"
        assert seen["hit"] > 0 and seen["miss"] > 0 and seen["refreshed"] > 0, seen
        assert store.stats().corrupt == {}, "an eviction must never look like corruption"
        assert entries(store.namespace_dir) == []
    check_after_crashes(outside.cache)
    reliability.record(
        f"eviction by 2 other writer processes racing loads on 3 threads ({seconds} s, "
        "cap 8 records, 24 keys)",
        "store",
        seen["hit"] + seen["miss"],
        f"{seen['hit']} hits, all whole payloads of their key; {seen['miss']} misses, all "
        "clean (0 corrupt, 0 quarantined); folder sound after the writers were killed",
    )


@pytest.mark.parametrize(
    "seconds", [pytest.param(4, id="4s"), pytest.param(45, id="45s", marks=pytest.mark.slow)]
)
def test_verify_racing_writers_reports_nothing_in_flight(
    outside, reliability, seconds: float
) -> None:
    with open_fuzz_store(outside.cache) as store:
        writers = Writers(outside.cache, 2, seed=11)
        problems: Counter[str] = Counter()
        runs = 0
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                for p in store.verify():
                    problems[f"{p.kind}: {p.detail[:60]}"] += 1
                runs += 1
        finally:
            writers.stop()
        assert not problems, problems
    check_after_crashes(outside.cache)
    reliability.record(
        f"verify() over the folder while 2 writer processes put, evict and delete ({seconds} s)",
        "store",
        runs,
        "no problem reported for writes, evictions or deletes in flight; folder sound after",
    )
