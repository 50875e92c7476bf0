"""The disk folder owns its settings: one cap for every namespace and process using it."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sqlite3
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.store import (
    DiskStore,
    auto_disk_capacity,
    effective_capacity,
    list_namespaces,
    remove_namespace,
)
from kvtier.store.disk.index import SCHEMA_VERSION, charge
from tests.support.faults import FUZZ_PAYLOAD, FUZZ_RECORD, fuzz_key, fuzz_payload
from tests.support.store import disk_capacity, make_namespace
from tests.support.workers import open_with_cap


def fuzz_store(root: Path, model: str, capacity: int | None) -> DiskStore:
    return DiskStore(root, make_namespace(model=model, block_bytes=FUZZ_PAYLOAD), capacity, 0)


def records_of(store: DiskStore) -> int:
    return len(list(store.keys()))


def test_an_explicit_cap_from_another_process_is_picked_up_and_evicted_down_to(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    big, small = disk_capacity(10, FUZZ_PAYLOAD), disk_capacity(4, FUZZ_PAYLOAD)
    with fuzz_store(root, "a", big) as first:
        for i in range(10):
            assert first.put(fuzz_key(i), fuzz_payload(i, 1))
        assert records_of(first) == 10
        child = multiprocessing.get_context("spawn").Process(
            target=open_with_cap, args=(str(root), "b", small, 1)
        )
        child.start()
        child.join(120)
        assert child.exitcode == 0
        # The child's put already evicted down to the new cap, across namespaces.
        assert first.footprint_bytes() <= small
        with caplog.at_level(logging.INFO, logger="kvtier.store.disk.store"):
            first.refresh()
        assert first.capacity_bytes == small
        assert f"capacity {big} -> {small} bytes" in caplog.text
        assert first.put(fuzz_key(50), fuzz_payload(50, 1))
        assert first.footprint_bytes() <= small


def test_a_different_explicit_cap_is_logged_once_old_to_new(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fuzz_store(root, "a", disk_capacity(8, FUZZ_PAYLOAD)).close()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="kvtier.store.disk.root"):
        fuzz_store(root, "a", disk_capacity(6, FUZZ_PAYLOAD)).close()
        fuzz_store(root, "a", disk_capacity(6, FUZZ_PAYLOAD)).close()  # same: no line
    lines = [r.getMessage() for r in caplog.records if "capacity" in r.getMessage()]
    assert lines == [
        f"disk tier: {root} capacity {disk_capacity(8, FUZZ_PAYLOAD)} -> "
        f"{disk_capacity(6, FUZZ_PAYLOAD)} bytes"
    ]


def test_no_cap_adopts_the_folders_cap(root: Path) -> None:
    cap = disk_capacity(5, FUZZ_PAYLOAD)
    fuzz_store(root, "a", cap).close()
    with fuzz_store(root, "b", None) as other:
        assert other.capacity_bytes == cap


def test_no_cap_on_a_new_folder_is_a_quarter_of_the_file_system(root: Path) -> None:
    with fuzz_store(root, "a", None) as store:
        st = os.statvfs(root)
        want = min(st.f_blocks * st.f_frsize // 4, 256 << 30)
        assert store.capacity_bytes == auto_disk_capacity(root)
        assert abs(store.capacity_bytes - want) <= 1


def test_the_cap_covers_every_namespace_in_the_folder(root: Path) -> None:
    cap = disk_capacity(6, FUZZ_PAYLOAD)
    with fuzz_store(root, "a", cap) as a, fuzz_store(root, "b", cap) as b:
        for i in range(20):
            assert (a if i % 2 else b).put(fuzz_key(i), fuzz_payload(i, 1))
            assert a.footprint_bytes() <= cap
        a.refresh()
        b.refresh()
        assert records_of(a) + records_of(b) <= 6
        assert a.used_bytes() == (records_of(a) + records_of(b)) * charge(FUZZ_RECORD)


def test_removing_a_namespace_releases_its_charge(root: Path) -> None:
    cap = disk_capacity(6, FUZZ_PAYLOAD)
    with fuzz_store(root, "a", cap) as a:
        b = fuzz_store(root, "b", cap)
        for i in range(3):
            assert b.put(fuzz_key(i), fuzz_payload(i, 1))
        b.close()
        assert a.used_bytes() == 3 * charge(FUZZ_RECORD)
        digest = b.namespace.digest_hex()
        remove_namespace(root, digest)
        assert a.used_bytes() == 0
        assert [n.digest_hex for n in list_namespaces(root)] == [a.namespace.digest_hex()]


def set_schema(root: Path, version: int) -> None:
    conn = sqlite3.connect(root / "index.sqlite3")
    with conn:
        conn.execute("UPDATE meta SET value = ? WHERE name = 'schema_version'", (version,))
    conn.close()


def test_an_index_of_a_newer_schema_is_refused_with_the_fix(root: Path) -> None:
    fuzz_store(root, "a", disk_capacity(4, FUZZ_PAYLOAD)).close()
    set_schema(root, SCHEMA_VERSION + 1)
    with pytest.raises(ConfigError, match=r"newer kvtier wrote this folder; upgrade kvtier or"):
        fuzz_store(root, "a", None)
    set_schema(root, SCHEMA_VERSION)
    fuzz_store(root, "a", None).close()  # untouched by the refusal


def test_an_index_of_an_older_unknown_schema_is_refused(root: Path) -> None:
    fuzz_store(root, "a", disk_capacity(4, FUZZ_PAYLOAD)).close()
    set_schema(root, 0)
    with pytest.raises(ConfigError, match=r"cannot migrate; remove the folder or point disk_dir"):
        fuzz_store(root, "a", None)


def test_a_schema_1_namespace_folder_is_migrated_by_dropping_its_records(root: Path) -> None:
    with fuzz_store(root, "a", disk_capacity(4, FUZZ_PAYLOAD)) as store:
        assert store.put(fuzz_key(1), fuzz_payload(1, 1))
        folder = store.namespace_dir
    # What schema 1 left: an index in the namespace folder and records it alone accounted for.
    legacy = sqlite3.connect(folder / "index.sqlite3")
    with legacy:
        legacy.execute("CREATE TABLE meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL)")
        legacy.execute("INSERT INTO meta VALUES ('schema_version', 1)")
    legacy.close()
    stray = folder / "blocks" / "ab" / ("ab" * 36 + ".7.kvb")
    stray.parent.mkdir(mode=0o700)
    stray.write_bytes(bytes(FUZZ_RECORD))
    with fuzz_store(root, "a", None) as store:
        assert not (folder / "index.sqlite3").exists()
        assert not stray.exists()
        assert records_of(store) == 0 and store.used_bytes() == 0
        assert store.put(fuzz_key(2), fuzz_payload(2, 1))
        assert store.verify() == []


def test_effective_capacity_is_the_request_the_folders_cap_or_the_default(root: Path) -> None:
    assert effective_capacity(root, 123) == 123
    assert effective_capacity(root, None) == auto_disk_capacity(root)
    assert not root.exists()  # nothing created
    cap = disk_capacity(5, FUZZ_PAYLOAD)
    fuzz_store(root, "a", cap).close()
    before = sorted(p.name for p in root.iterdir())
    assert effective_capacity(root, None) == cap
    assert sorted(p.name for p in root.iterdir()) == before
