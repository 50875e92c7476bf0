"""A damaged or planted record file is a miss, is quarantined, counted, and can be rewritten."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier.format import HEADER_BYTES
from kvtier.store import DiskStore
from kvtier.store.disk.quarantine import entries
from tests.support.store import (
    PAYLOAD_BYTES,
    aligned_buffer,
    charged_bytes,
    key_of,
    make_namespace,
    payload_of,
)

OpenDisk = Callable[..., DiskStore]


def stored(open_disk: OpenDisk) -> tuple[DiskStore, Path]:
    store = open_disk()
    assert store.put(key_of(1), payload_of(1))
    path = store.record_path(key_of(1))
    assert path is not None
    return store, path


def flip_bit(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x10]))


def assert_quarantined(store: DiskStore, reason: str) -> None:
    """The read misses, the file went to quarantine under ``reason``, and a rewrite works."""
    before = store.used_bytes()
    assert not store.get_into(key_of(1), aligned_buffer(PAYLOAD_BYTES))
    names = entries(store.namespace_dir)
    assert len(names) == 1 and f".{reason}." in names[0], names
    assert store.stats().corrupt == {reason: 1}
    assert store.stats().quarantined == 1
    assert not store.contains(key_of(1))
    # The record's charge left with its row; the quarantine entry (and its reason file) is
    # charged instead, for as long as it is kept.
    assert store.used_bytes() == before - (HEADER_BYTES + PAYLOAD_BYTES) + charged_bytes(
        store.namespace_dir / "quarantine"
    )
    assert store.put(key_of(1), payload_of(1))
    assert store.get(key_of(1)) == payload_of(1)
    assert [p for p in store.verify() if not p.fixed] == []


def test_bit_flip_in_payload_is_quarantined_as_checksum(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    flip_bit(path, HEADER_BYTES + 1234)
    assert_quarantined(store, "checksum")


def test_bit_flip_in_header_is_quarantined_as_header_checksum(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    flip_bit(path, 20)  # inside the namespace digest
    assert_quarantined(store, "header_checksum")


def test_bit_flip_in_header_padding_is_quarantined(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    flip_bit(path, 3000)
    assert_quarantined(store, "header_checksum")


def test_unknown_version_is_quarantined_as_version(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    flip_bit(path, 9)
    assert_quarantined(store, "version")


def test_truncated_file_is_quarantined_as_length(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    os.truncate(path, HEADER_BYTES + PAYLOAD_BYTES // 2)
    assert_quarantined(store, "length")


def test_extended_file_is_quarantined_as_length(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    with open(path, "ab") as f:
        f.write(b"extra")
    assert_quarantined(store, "length")


def test_zero_filled_file_is_quarantined_as_bad_magic(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    path.write_bytes(bytes(HEADER_BYTES + PAYLOAD_BYTES))
    assert_quarantined(store, "bad_magic")


def test_wrong_magic_is_quarantined_as_bad_magic(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    with open(path, "r+b") as f:
        f.write(b"NOTKVTIE")
    assert_quarantined(store, "bad_magic")


def test_file_copied_from_other_namespace_is_quarantined(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    other = open_disk(namespace=make_namespace(model="other/model"))
    other.put(key_of(1), payload_of(1))
    other_path = other.record_path(key_of(1))
    assert other_path is not None and other_path.parent.parent.parent != path.parent.parent.parent
    shutil.copyfile(other_path, path)
    assert_quarantined(store, "namespace")
    assert other.get(key_of(1)) == payload_of(1)


def test_file_renamed_to_another_key_is_quarantined_as_key(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    store.put(key_of(2), payload_of(2))
    other = store.record_path(key_of(2))
    assert other is not None
    os.replace(other, path)
    store.delete(key_of(2))  # its file now sits at key 1's name
    assert_quarantined(store, "key")


def test_symlink_in_place_of_record_is_quarantined_not_followed(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    store.put(key_of(2), payload_of(2))
    valid = store.record_path(key_of(2))
    decoy = store.root.parent / "decoy"
    os.replace(path, decoy)  # a valid record of key 1, reachable only through the link
    os.symlink(decoy, path)
    assert_quarantined(store, "symlink")
    assert valid is not None and valid.exists() and decoy.exists()


def plant_fifo(path: Path) -> None:
    os.mkfifo(path, 0o600)


def plant_directory(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_bytes(b"x")


@pytest.mark.timeout(20)  # a FIFO opened in blocking mode would hang here
@pytest.mark.parametrize("plant", [plant_fifo, plant_directory], ids=["fifo", "directory"])
def test_non_regular_file_in_place_of_record_is_quarantined(
    open_disk: OpenDisk, plant: Callable[[Path], None]
) -> None:
    store, path = stored(open_disk)
    path.unlink()
    plant(path)
    assert_quarantined(store, "not_regular")


def test_file_removed_by_someone_else_is_a_clean_miss(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    path.unlink()
    assert not store.get_into(key_of(1), aligned_buffer(PAYLOAD_BYTES))
    assert not store.contains(key_of(1))
    assert store.stats().corrupt == {}
    assert entries(store.namespace_dir) == []


def test_quarantine_keeps_only_the_newest_entries(open_disk: OpenDisk) -> None:
    store = open_disk(quarantine_max_entries=2)
    for i in range(4):
        store.put(key_of(i), payload_of(i))
        path = store.record_path(key_of(i))
        assert path is not None
        flip_bit(path, HEADER_BYTES)
        assert not store.get_into(key_of(i), aligned_buffer(PAYLOAD_BYTES))
    names = entries(store.namespace_dir)
    assert [n[:2] for n in names] == [key_of(2).hex()[:2], key_of(3).hex()[:2]]
    assert store.stats().quarantined == 4


def test_verify_finds_and_fixes_a_corrupt_record(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    flip_bit(path, HEADER_BYTES + 5)
    problems = store.verify()
    assert [(p.kind, p.key) for p in problems] == [("corrupt", key_of(1))]
    assert "checksum" in problems[0].detail
    assert all(p.fixed for p in store.verify(fix=True))
    assert store.verify() == []
    assert not store.contains(key_of(1))
    assert len(entries(store.namespace_dir)) == 1


def test_verify_reconciles_quarantine_files_with_their_charges(open_disk: OpenDisk) -> None:
    store, path = stored(open_disk)
    flip_bit(path, HEADER_BYTES + 1)
    assert store.get(key_of(1)) is None
    (name,) = entries(store.namespace_dir)
    quarantine = store.namespace_dir / "quarantine"
    (quarantine / name).unlink()  # removed by hand: its charge must not stay forever
    (quarantine / "planted.kvb").write_bytes(b"x" * 5000)  # not charged: must not stay
    problems = store.verify(fix=True)
    assert sorted((p.kind, p.path, p.fixed) for p in problems) == [
        ("quarantine", f"quarantine/{name}", True),
        ("quarantine", "quarantine/planted.kvb", True),
    ]
    assert not (quarantine / "planted.kvb").exists()
    assert store.used_bytes() == charged_bytes(quarantine) == 0
    assert store.verify() == []


def _spin() -> None:
    while True:
        pass


def test_a_corrupt_load_does_not_wait_the_busy_timeout_behind_a_slow_reader(
    open_disk: Callable[..., DiskStore], root: Path
) -> None:
    """Busy CPUs slow a reader in another process (``kvtier du``, a second engine) that
    holds an index snapshot; the WAL passes its bound behind it, so every index write waits
    the busy timeout (30 s by default, the load deadline's ceiling). A load's quarantine
    must not: the load answers within a bounded wait and the record is never offered again."""
    import multiprocessing
    import sqlite3
    import time
    from contextlib import closing

    from kvtier.store.disk.index import WAL_SIZE_LIMIT_BYTES
    from tests.support.store import aligned_buffer

    store = open_disk(records=64, busy_timeout_s=10.0)
    for i in range(4):
        assert store.put(key_of(i), payload_of(i))
    index = root / "index.sqlite3"
    reader = sqlite3.connect(f"file:{index}?mode=ro", uri=True, isolation_level=None)
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(os.cpu_count() or 1)]
    try:
        with closing(sqlite3.connect(index)) as conn:  # the WAL starts empty, as after a checkpoint
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        reader.execute("BEGIN")
        reader.execute("SELECT COUNT(*) FROM records").fetchone()
        # Other writers' commits pass the WAL's bound behind the reader's snapshot (a scratch
        # table's rows: the store's own puts would make the one that crosses wait too).
        with closing(sqlite3.connect(index, isolation_level=None)) as other:
            other.execute("CREATE TABLE scratch (page BLOB)")
            while os.path.getsize(f"{index}-wal") <= WAL_SIZE_LIMIT_BYTES:
                other.execute("INSERT INTO scratch VALUES (?)", (os.urandom(4000),))
        os.truncate(store.record_path(key_of(1)), 100)
        for hog in hogs:
            hog.start()
        started = time.monotonic()
        assert not store.get_into(key_of(1), aligned_buffer(PAYLOAD_BYTES))
        took = time.monotonic() - started
        assert took < 3.0, f"a corrupt load waited {took:.1f} s on the index"
        assert not store.contains(key_of(1)), "a bad record is not offered again"
        assert store.get(key_of(2)) == payload_of(2)
    finally:
        for hog in hogs:
            if hog.is_alive():
                hog.kill()
        reader.close()
    store.verify(fix=True)  # the row whose bookkeeping was skipped
    assert store.verify() == []
