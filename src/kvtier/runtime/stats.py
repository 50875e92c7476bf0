"""What a tier did since start-up, counted from all of its threads under one lock.

A tier's counters are bumped from the scheduler thread (dropped stores), every read and write
thread (loads, stores, their I/O seconds, failures) and the opener (open failures), up to a
dozen threads at once. ``+=`` on an attribute is a read, an add and a write: two threads can
read the same value and one increment is lost. Every bump therefore takes one lock, and
readers get a copy (``snapshot``) that later bumps do not change. The lock is held for an
add, never for I/O, so it costs nothing the scheduler could notice.

Knows nothing of vLLM: metrics read the snapshot (``kvtier.vllm.metrics.snapshot``).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TierCounters:
    """A tier's totals at one moment (scheduler process); read by metrics and logs."""

    #: Blocks whose store was dropped because the tier's queue was full.
    stores_dropped: int = 0
    #: Blocks not written because no restore from the tier could pay
    #: (``kvtier.policy.write_admission``).
    stores_skipped: int = 0
    #: Blocks stored without their server part (the queue was full; the part that needs no
    #: server, a disk, was written).
    server_stores_dropped: int = 0
    #: Blocks whose load failed (missing, failed check, I/O error); abandoned ones excluded.
    load_failures: int = 0
    #: Blocks whose load was abandoned at its deadline.
    loads_abandoned: int = 0
    #: Abandoned loads still running in an I/O thread now (a gauge, not a counter).
    loads_stuck: int = 0
    #: Blocks loaded into the host pool.
    loads: int = 0
    #: Blocks stored (or found already stored).
    stores: int = 0
    #: Times the store could not be opened.
    open_failures: int = 0
    #: Blocks whose transfer shutdown dropped (not started by its drain deadline).
    dropped_at_shutdown: int = 0
    #: Transfers still running in an I/O thread when shutdown's drain deadline passed.
    stuck_at_shutdown: int = 0
    #: Seconds spent in store I/O by the tier's threads: successful loads, every store.
    read_seconds: float = 0.0
    write_seconds: float = 0.0


class TierStats:
    """The tier's counters; every method may be called from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._totals = TierCounters()

    def _add(self, **increments: float) -> None:
        with self._lock:
            totals = self._totals
            self._totals = dataclasses.replace(
                totals, **{name: getattr(totals, name) + n for name, n in increments.items()}
            )

    def stored(self, seconds: float, *, ok: bool) -> None:
        """One store task ended after ``seconds`` of I/O; ``ok``: the block is stored."""
        if ok:
            self._add(stores=1, write_seconds=seconds)
        else:
            self._add(write_seconds=seconds)

    def stored_many(self, seconds: float, stored: int) -> None:
        """Store tasks of several blocks ended after ``seconds`` of I/O in all; ``stored``
        of the blocks are stored (one update for them all)."""
        self._add(stores=stored, write_seconds=seconds)

    def loaded(self, seconds: float) -> None:
        """One block loaded after ``seconds`` of I/O."""
        self._add(loads=1, read_seconds=seconds)

    def load_failed(self) -> None:
        self._add(load_failures=1)

    def abandoned(self, blocks: int) -> None:
        self._add(loads_abandoned=blocks)

    def dropped(self, blocks: int) -> None:
        self._add(stores_dropped=blocks)

    def skipped(self, blocks: int) -> None:
        self._add(stores_skipped=blocks)

    def dropped_server_part(self, blocks: int) -> None:
        self._add(server_stores_dropped=blocks)

    def open_failed(self) -> None:
        self._add(open_failures=1)

    def stuck(self, loads: int) -> None:
        """``loads`` more (or, negative, fewer) abandoned loads hold an I/O thread now."""
        self._add(loads_stuck=loads)

    def shut_down(self, *, dropped: int, stuck: int) -> None:
        self._add(dropped_at_shutdown=dropped, stuck_at_shutdown=stuck)

    def snapshot(self) -> TierCounters:
        """The totals now (an immutable value: later bumps do not change it)."""
        with self._lock:
            return self._totals
