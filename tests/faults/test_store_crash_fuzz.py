"""SIGKILL at random moments: writers die mid-put, mid-load, mid-eviction, mid-open.

Store level, no engine: 1-3 writer processes (``workers.write_forever``) share one store folder
and are each SIGKILLed at a random moment; the folder is reused across iterations, so crashes
pile up on each other's leftovers, and a crash can hit the next writer while it reclaims the
last one's. After a third of the iterations (and at the end) a fresh store opens the folder and
every record it offers must be a whole payload of its key, nothing may be corrupt, ``verify()``
must find nothing, no temp file may remain and the bytes on disk must equal the index, under the
cap. The writers themselves check every payload they load while they run.
"""

from __future__ import annotations

import multiprocessing
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from tests.support.crash import CRASH_EXIT_CODE, fill_then_crash, open_store
from tests.support.faults import (
    FUZZ_CAPACITY,
    check_after_crashes,
    forkserver,
    open_fuzz_store,
)
from tests.support.store import files_under
from tests.support.workers import open_and_crash_in_reclaim, open_close_loop, write_forever

pytestmark = [pytest.mark.faults, pytest.mark.timeout(1200)]

CAPACITY = FUZZ_CAPACITY
#: Writers are killed this long (uniformly random) after they were started.
KILL_WINDOW_S = 0.3


def crash_fuzz(root: Path, iterations: int, max_writers: int, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    ctx = forkserver()
    seen: Counter[str] = Counter()
    for n in range(iterations):
        writers = [
            ctx.Process(target=write_forever, args=(str(root), rng.getrandbits(32)))
            for _ in range(rng.randint(1, max_writers))
        ]
        for w in writers:
            w.start()
        started = time.monotonic()
        for at, w in sorted(
            ((rng.uniform(0, KILL_WINDOW_S), w) for w in writers), key=lambda p: p[0]
        ):
            time.sleep(max(0.0, started + at - time.monotonic()))
            w.kill()
        for w in writers:
            w.join(60)
            assert w.exitcode == -signal.SIGKILL, f"iteration {n}: writer exited {w.exitcode}"
        seen["kills"] += len(writers)
        if n % 3 == 2 or n == iterations - 1:
            seen["records_checked"] += check_after_crashes(root)
            seen["checks"] += 1
    return seen


@pytest.mark.parametrize(
    ("iterations", "max_writers"),
    [
        pytest.param(150, 2, id="150x"),
        pytest.param(600, 3, id="600x", marks=pytest.mark.slow),
    ],
)
def test_sigkilled_writers_never_leave_wrong_data_or_leaks(
    outside, reliability, iterations: int, max_writers: int
) -> None:
    seen = crash_fuzz(outside.cache, iterations, max_writers, seed=iterations)
    reliability.record(
        f"SIGKILL of 1-{max_writers} concurrent store writers at a random moment "
        f"(0-{KILL_WINDOW_S * 1000:.0f} ms: open, put, load, delete, evict, refresh)",
        "store",
        iterations,
        f"{seen['kills']} processes killed; {seen['checks']} reopen checks served "
        f"{seen['records_checked']} records, all whole payloads of their key; 0 corrupt, "
        "verify() clean, no temp file, bytes on disk == index <= cap every time",
    )


def crash(target, *args: object) -> None:  # type: ignore[no-untyped-def]
    process = multiprocessing.get_context("spawn").Process(target=target, args=args)
    process.start()
    process.join(60)
    assert process.exitcode == CRASH_EXIT_CODE


def test_crash_while_reclaiming_a_dead_writer_leaves_no_orphan(outside, reliability) -> None:
    """Regression: a store that died between dropping a dead writer's pending row and
    unlinking its published file left that file behind, outside the cap and the index."""
    root = outside.cache
    crash(fill_then_crash, str(root), "after_rename", 0)  # a published file, row pending
    crash(open_and_crash_in_reclaim, str(root))  # dies while reclaiming it
    with open_store(str(root)) as store:
        assert store.verify() == []
        assert files_under(store.namespace_dir / "blocks") == []
        assert store.used_bytes() == 0
    reliability.record(
        "SIGKILL-like exit of a store while it reclaims a dead writer's published file",
        "store",
        1,
        "the next open unlinks the file; verify() clean, 0 bytes used",
    )


def test_stores_opening_and_closing_at_once_never_fail_to_open(outside, reliability) -> None:
    """Regression: an open listed sessions/ and then stat()ed each lock file; a lock another
    store had just removed (closed, or reaped as dead) made the open raise FileNotFoundError,
    which disables the disk tier of the engine that was starting."""
    ctx = forkserver()
    with open_fuzz_store(outside.cache):
        pass
    rounds = 60
    openers = [
        ctx.Process(target=open_close_loop, args=(str(outside.cache), rounds)) for _ in range(4)
    ]
    for p in openers:
        p.start()
    for p in openers:
        p.join(120)
    assert [p.exitcode for p in openers] == [0] * len(openers)
    check_after_crashes(outside.cache)
    reliability.record(
        "4 processes opening and closing the store at once, 60 times each",
        "store",
        4 * rounds,
        "every open succeeds",
    )
