"""``DiskStore.put_many``: one reservation and one commit per batch, per-record outcomes, and
every crash-safety and sharing property of a single put."""

from __future__ import annotations

import errno
import multiprocessing
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier.format import HEADER_BYTES
from kvtier.format.checksum import Buffer
from kvtier.store import DiskStore, RecordIO, RecordWriter
from kvtier.store.disk import layout
from kvtier.store.disk import root as root_settings
from kvtier.store.disk.index import PUT_BATCH_MAX, Index
from tests.support.crash import CRASH_EXIT_CODE, open_store, put_many_then_crash
from tests.support.store import PAYLOAD_BYTES, aligned_buffer, files_under, key_of, payload_of

OpenDisk = Callable[..., DiskStore]
RECORD = HEADER_BYTES + PAYLOAD_BYTES


def keys_and_payloads(first: int, count: int) -> tuple[list[bytes], list[bytes]]:
    numbers = range(first, first + count)
    return [key_of(i) for i in numbers], [payload_of(i) for i in numbers]


def write_transactions(store: DiskStore) -> list[str]:
    """Every transaction the store's connection commits from now on (a list it fills); a
    write begun and rolled back to checkpoint the WAL first is not one."""
    committed: list[str] = []
    store._index._conn.set_trace_callback(
        lambda sql: committed.append(sql) if sql == "COMMIT" else None
    )
    return committed


def test_a_batch_takes_one_reservation_and_one_commit(open_disk: OpenDisk) -> None:
    store = open_disk(records=64)
    begun = write_transactions(store)
    keys, payloads = keys_and_payloads(0, 8)
    assert store.put_many(keys, payloads) == [True] * 8
    assert len(begun) == 2
    assert store.stats().puts == 8
    assert all(store.get(k) == p for k, p in zip(keys, payloads, strict=True))


def test_a_long_list_is_stored_in_bounded_batches(open_disk: OpenDisk) -> None:
    store = open_disk(records=64)
    begun = write_transactions(store)
    keys, payloads = keys_and_payloads(0, PUT_BATCH_MAX + 4)
    assert store.put_many(keys, payloads) == [True] * len(keys)
    assert len(begun) == 4, "two batches, each one reservation and one commit"


def test_the_index_charge_and_the_floor_are_measured_once_per_batch(
    open_disk: OpenDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = open_disk(records=64, free_space_floor_bytes=1 << 20)
    measured = {"index": 0, "files": 0}
    index_charge = root_settings.index_charge
    measure_index_files = root_settings.measure_index_files

    def counting_charge(*args: object, **kwargs: object) -> int:
        measured["index"] += 1
        return index_charge(*args, **kwargs)  # type: ignore[arg-type]

    def counting_files(*args: object, **kwargs: object) -> tuple[dict[str, int], int | None]:
        measured["files"] += 1
        return measure_index_files(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(root_settings, "index_charge", counting_charge)
    monkeypatch.setattr(root_settings, "measure_index_files", counting_files)
    assert store.put_many(*keys_and_payloads(0, 8)) == [True] * 8
    assert measured == {"index": 1, "files": 1}


class FailsForKey(RecordWriter):
    """A full disk for one key's record only."""

    def __init__(self, key: bytes) -> None:
        super().__init__()
        self.key = key

    def write_temp(self, path: Path, header: bytes, payload: Buffer) -> None:
        if path.name.startswith(self.key.hex()):
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write_temp(path, header, payload)


def test_a_record_that_fails_is_a_failed_put_and_the_others_land(open_disk: OpenDisk) -> None:
    store = open_disk(io=RecordIO(FailsForKey(key_of(1))))
    keys, payloads = keys_and_payloads(0, 3)
    assert store.put_many(keys, payloads) == [True, False, True]
    stats = store.stats()
    assert (stats.puts, stats.put_failures) == (2, 1)
    assert store.used_bytes() == 2 * RECORD, "the failed record's reservation is released"
    assert store.get(key_of(1)) is None and store.get(key_of(2)) == payload_of(2)
    assert files_under(store.namespace_dir / "tmp") == []
    assert store.verify() == []


def test_an_empty_payload_fails_alone(open_disk: OpenDisk) -> None:
    store = open_disk()
    outcomes = store.put_many([key_of(1), key_of(2)], [b"", payload_of(2)])
    assert outcomes == [False, True]
    assert store.used_bytes() == RECORD
    assert store.verify() == []


def test_a_batch_evicts_the_least_recently_used_in_its_reservation(open_disk: OpenDisk) -> None:
    store = open_disk(records=4, low_watermark=1.0)
    assert store.put_many(*keys_and_payloads(0, 4)) == [True] * 4
    assert store.get(key_of(0)) == payload_of(0)  # now the most recently used
    begun = write_transactions(store)
    assert store.put_many(*keys_and_payloads(10, 2)) == [True, True]
    # Evicted files are still charged until unlinked: one reservation evicts, their trash
    # entries go once the files are, one reservation reserves, one commit.
    assert len(begun) == 4
    assert sorted(store.keys()) == sorted([key_of(0), key_of(3), key_of(10), key_of(11)])
    assert store.stats().evictions == 2
    assert store.used_bytes() <= 4 * RECORD
    assert store.verify() == []


def test_a_batch_larger_than_the_cap_stores_what_fits_and_refuses_the_rest(
    open_disk: OpenDisk,
) -> None:
    store = open_disk(records=4)
    outcomes = store.put_many(*keys_and_payloads(0, 6))
    assert outcomes == [True] * 4 + [False] * 2
    assert store.stats().put_failures == 2
    assert store.used_bytes() == 4 * RECORD
    assert store.verify() == []


def test_a_crash_between_the_files_and_the_commit_is_reclaimed_at_open(root: Path) -> None:
    process = multiprocessing.get_context("spawn").Process(
        target=put_many_then_crash, args=(str(root), "after_rename", 3)
    )
    process.start()
    process.join(60)
    assert process.exitcode == CRASH_EXIT_CODE
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    assert len(files_under(folder / "blocks")) == 3, "every file published, none committed"
    with open_store(str(root)) as store:
        assert not any(store.contains(key_of(i)) for i in range(3))
        assert files_under(store.namespace_dir / "blocks") == []
        assert store.used_bytes() == 0
        assert store.verify() == []


class ReclaimsBeforeCommit(RecordWriter):
    """Another process judges the writer dead while its batch is being written: its pending
    rows are reclaimed (their files trashed) before it commits."""

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.root = root
        self.session = ""

    def publish(self, temp: Path, final: Path) -> None:
        super().publish(temp, final)
        other = Index(self.root / layout.INDEX_FILE, "other-process", None)
        try:
            other.reclaim({self.session})
        finally:
            other.close()


def test_a_batch_whose_reservations_were_reclaimed_fails_whole_and_leaves_nothing(
    open_disk: OpenDisk, root: Path
) -> None:
    writer = ReclaimsBeforeCommit(root)
    store = open_disk(io=RecordIO(writer))
    writer.session = store._session.session_id
    assert store.put_many(*keys_and_payloads(0, 3)) == [False] * 3
    assert store.stats().put_failures == 3
    assert not any(store.contains(key_of(i)) for i in range(3))
    assert files_under(store.namespace_dir / "blocks") == []
    store.refresh()  # the reclaimer's trash entries, left to its own session (dead by now)
    assert store.used_bytes() == 0
    assert store.verify() == []


def test_batches_of_two_stores_in_several_threads_hold_the_shared_cap(
    open_disk: OpenDisk,
) -> None:
    stores = [open_disk(records=12), open_disk(records=12)]
    cap = stores[0].capacity_bytes
    peaks: list[int] = []
    errors: list[BaseException] = []

    def writer(store: DiskStore, first: int) -> None:
        try:
            for batch in range(6):
                keys, payloads = keys_and_payloads(first + 5 * batch, 5)
                store.put_many(keys, payloads)
                peaks.append(store.footprint_bytes())
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(stores[t % 2], 1000 * t)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert max(peaks) <= cap
    assert sum(s.stats().puts for s in stores) >= 4 * 6 * 5 // 2
    for store in stores:
        store.refresh()
        assert store.verify() == []


def test_one_reservation_numbers_its_records_as_the_index_does(open_disk: OpenDisk) -> None:
    # One multi-row insert: the ids are read back as consecutive, not one lastrowid a row.
    store = open_disk(records=64)
    keys, payloads = keys_and_payloads(0, PUT_BATCH_MAX)
    assert store.put_many(keys, payloads) == [True] * PUT_BATCH_MAX
    ids = {row.key: row.record_id for row in store._index.all_rows()}
    assert sorted(ids) == sorted(keys)
    for key, record_id in ids.items():
        assert (store.namespace_dir / layout.record_name(key, record_id)).is_file()
    store.close()
    reopened = open_disk(records=64)  # ids from the index alone
    out = aligned_buffer(PAYLOAD_BYTES)
    for key, payload in zip(keys, payloads, strict=True):
        assert reopened.get_into(key, out) and bytes(out) == payload
