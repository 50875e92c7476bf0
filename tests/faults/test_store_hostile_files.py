"""Hostile or broken record files, at random, in a store that keeps serving the good ones.

tests/store/test_store_corruption.py pins one case per reason; here every kind of damage in
``fault_helpers.DAMAGES`` hits random records of a live store, many times over, interleaved
with loads of healthy records. Each damaged record must be a miss, quarantined under one of the
reasons its damage allows, never offered again; healthy records keep being served; the folder
verifies clean at the end; a link's target outside the cache is never changed.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path

import pytest

from kvtier import native
from kvtier.store import DiskStore, NativeRecordReader, RecordIO, RecordReader
from kvtier.store.disk.quarantine import entries
from tests.support.faults import (
    DAMAGES,
    FUZZ_PAYLOAD,
    FUZZ_RECORD,
    Sources,
    assert_store_sound,
    damages_unavailable,
    fuzz_key,
    fuzz_namespace,
    fuzz_payload,
    key_of_record,
    payload_ok,
)
from tests.support.store import aligned_buffer, disk_capacity, make_namespace

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

HEALTHY = 6
#: Quarantine entries kept: each is charged against the root's cap, as are the other
#: namespace's records and the index (whose change log grows over a long run), so the cap
#: leaves room for them besides the healthy records.
QUARANTINE_KEPT = 6
CAPACITY = disk_capacity(HEALTHY + 4 + QUARANTINE_KEPT + 2 + 16, FUZZ_PAYLOAD)
QUARANTINE_BYTES = QUARANTINE_KEPT * (FUZZ_RECORD + 4096)


def hostile_run(guard, rounds: int, seed: int, native_reads: bool) -> Counter[str]:  # type: ignore[no-untyped-def]
    rng = random.Random(seed)
    reasons: Counter[str] = Counter()
    store = DiskStore(
        guard.cache,
        fuzz_namespace(),
        CAPACITY,
        free_space_floor_bytes=0,
        quarantine_max_bytes=QUARANTINE_BYTES,
        io=RecordIO(reader=NativeRecordReader() if native_reads else RecordReader()),
    )
    foreign = DiskStore(
        guard.cache,
        make_namespace(model="faults/another-model", block_bytes=len(fuzz_payload(0, 0))),
        CAPACITY,
        free_space_floor_bytes=0,
    )
    with store, foreign:
        for i in range(HEALTHY):
            assert store.put(fuzz_key(i), fuzz_payload(i, 1))

        def other_key_record() -> Path:
            path = store.record_path(fuzz_key(rng.randrange(HEALTHY)))
            assert path is not None
            return path

        def other_namespace_record(victim: Path) -> Path:
            key = key_of_record(victim)
            assert foreign.put(key, fuzz_payload(int.from_bytes(key[:32], "big"), 1))
            path = foreign.record_path(key)
            assert path is not None
            return path

        sources = Sources(other_key_record, other_namespace_record, guard.sibling / "decoy.kvb")
        names = sorted(set(DAMAGES) - set(damages_unavailable()))
        for n in range(rounds):
            name = names[n % len(names)]
            allowed, damage = DAMAGES[name]
            victim = 100 + n
            assert store.put(fuzz_key(victim), fuzz_payload(victim, 1))
            path = store.record_path(fuzz_key(victim))
            assert path is not None
            damage(path, rng, sources)
            before = store.stats().corrupt
            assert store.get(fuzz_key(victim)) is None, f"{name}: damaged record served"
            after = store.stats().corrupt
            (reason,) = [r for r in after if after[r] != before.get(r, 0)]
            assert reason in allowed, f"{name}: quarantined as {reason}, want one of {allowed}"
            assert not store.contains(fuzz_key(victim))
            assert f".{reason}." in entries(store.namespace_dir)[-1]
            reasons[f"{name}: {reason}"] += 1
            healthy = rng.randrange(HEALTHY)  # the good ones keep being served
            assert payload_ok(healthy, store.get(fuzz_key(healthy)) or b"")
        assert len(entries(store.namespace_dir)) <= 64, "quarantine stays bounded"
        assert_store_sound(store, CAPACITY)
    return reasons


@pytest.mark.parametrize(
    "rounds",
    [
        pytest.param(len(DAMAGES) * 20, id="20-each"),
        pytest.param(len(DAMAGES) * 200, id="200-each", marks=pytest.mark.slow),
    ],
)
@pytest.mark.parametrize("native_reads", [True, False], ids=["native-reader", "python-reads"])
def test_every_kind_of_damaged_record_is_a_quarantined_miss(
    outside, reliability, rounds: int, native_reads: bool
):
    """The native reader (where built) and the Python read path, on the same damages."""
    if native_reads and native.record_reader() is None:
        pytest.skip("kvtier.native._recordread is not built")
    reasons = hostile_run(outside, rounds, seed=rounds, native_reads=native_reads)
    if not native_reads:
        return  # the table row is the default path's
    left_out = damages_unavailable()  # e.g. another user's file, where chown is refused
    for name, why in sorted(left_out.items()):
        reliability.record(f"record file {name}", "store", 0, f"not applied here: {why}")
    for name in sorted(set(DAMAGES) - set(left_out)):
        seen = {k.split(": ")[1]: v for k, v in reasons.items() if k.split(": ")[0] == name}
        reliability.record(
            f"record file {name}",
            "store",
            sum(seen.values()),
            "miss + quarantined as "
            + ", ".join(f"{r} ({v})" for r, v in sorted(seen.items()))
            + "; never offered again; healthy records still served",
        )


class WatchedReader(RecordReader):
    """Records whether each read was opened with O_DIRECT."""

    def __init__(self) -> None:
        super().__init__(direct_reads=True)
        self.direct: list[bool] = []

    def open_for_read(self, path: Path, direct: bool) -> int:
        self.direct.append(direct)
        return super().open_for_read(path, direct)


def test_a_planted_fifo_does_not_turn_off_direct_reads(outside, reliability) -> None:
    """Regression: a FIFO refuses O_DIRECT with EINVAL as a file system without O_DIRECT
    does; the store took it for the file system and read buffered from then on."""
    io = WatchedReader()
    with DiskStore(outside.cache, fuzz_namespace(), CAPACITY, 0, io=RecordIO(reader=io)) as store:
        for i in range(2):
            assert store.put(fuzz_key(i), fuzz_payload(i, 1))
        out = aligned_buffer(len(fuzz_payload(0, 0)))
        assert store.get_into(fuzz_key(0), out)
        if io.direct != [True]:
            pytest.skip("this file system refuses O_DIRECT anyway")
        path = store.record_path(fuzz_key(1))
        assert path is not None
        path.unlink()
        os.mkfifo(path, 0o600)
        assert not store.get_into(fuzz_key(1), out)
        assert store.stats().corrupt == {"not_regular": 1}
        assert store.get_into(fuzz_key(0), out)
        assert io.direct[-1] is True, "reads of real records still use O_DIRECT"
    reliability.record(
        "FIFO planted in place of a record, read into a page-aligned buffer (O_DIRECT path)",
        "store",
        1,
        "miss + quarantined as not_regular; later reads still use O_DIRECT",
    )
