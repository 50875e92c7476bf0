"""Storage faults under a running store: injected errnos, full file systems, read-only folders.

Store level (no engine). Faults enter at the I/O seam (a store's ``RecordIO``: writer and reader
subclasses) or come from real file systems the test mounts (tmpfs, a loop-mounted ext4 image: root
only). In every case a load returns the key's last stored payload or misses, a put either stores or
returns False, nothing raises, and once the fault is gone the folder holds no file the index does
not name.
"""

from __future__ import annotations

import errno
import logging
import os
import random
from collections import Counter
from pathlib import Path

import pytest

from kvtier import native
from kvtier.format.checksum import Buffer
from kvtier.store import DiskStore, NativeRecordReader, RecordIO, RecordReader, RecordWriter
from kvtier.store.disk.index import charge
from kvtier.store.disk.quarantine import entries
from tests.support.faults import (
    FUZZ_CAPACITY,
    FUZZ_CAPACITY_RECORDS,
    FUZZ_KEYS,
    FUZZ_PAYLOAD,
    FUZZ_RECORD,
    Outside,
    assert_store_sound,
    bind_readonly,
    ext4_image,
    fill,
    fuzz_key,
    fuzz_namespace,
    fuzz_payload,
    open_fuzz_store,
    payload_ok,
    tmpfs,
)
from tests.support.store import aligned_buffer, disk_capacity

pytestmark = [pytest.mark.faults, pytest.mark.timeout(600)]

CAPACITY = FUZZ_CAPACITY
SMALL_CAPACITY = disk_capacity(4, FUZZ_PAYLOAD)
WRITE_ERRNOS = (errno.ENOSPC, errno.EIO, errno.EACCES, errno.EROFS, errno.EDQUOT)
READ_ERRNOS = (errno.EIO, errno.EACCES, errno.EMFILE, errno.ENOMEM)


class Faults:
    """Draws the injected faults of one run and counts them."""

    def __init__(self, rng: random.Random, rate: float) -> None:
        self.rng = rng
        self.rate = rate
        self.injected: Counter[str] = Counter()

    def fail(self, where: str, errnos: tuple[int, ...]) -> None:
        if self.rng.random() < self.rate:
            code = self.rng.choice(errnos)
            self.injected[f"{where}:{errno.errorcode[code]}"] += 1
            raise OSError(code, f"injected {os.strerror(code)}")

    def happens(self, what: str, rate: float) -> bool:
        if self.rng.random() < rate:
            self.injected[what] += 1
            return True
        return False


def flip_a_byte(path: Path, rng: random.Random) -> None:
    """Damage one byte of the file at ``path`` on disk (a bit rotted on the device)."""
    with open(path, "r+b") as f:
        f.seek(rng.randrange(os.fstat(f.fileno()).st_size))
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x40]))


class FlakyWriter(RecordWriter):
    """Fails a random share of writes, the way a sick disk or a full one does.

    ``write_file``: fails before writing, or after the whole file is written (a failed
    fdatasync). ``publish``: fails before the rename, or after it (a failed folder fsync).
    ``remove``: the unlink fails (the file stays; like the real one, it only logs).
    Rot: sometimes a record is damaged on disk right after it was published.
    """

    def __init__(self, faults: Faults) -> None:
        super().__init__()
        self.faults = faults

    def write_file(self, path: Path, header: Buffer, payload: memoryview, direct: bool) -> None:
        self.faults.fail("write", WRITE_ERRNOS)
        super().write_file(path, header, payload, direct)
        self.faults.fail("fsync", (errno.EIO, errno.ENOSPC))

    def publish(self, temp: Path, final: Path) -> None:
        self.faults.fail("rename", WRITE_ERRNOS)
        super().publish(temp, final)
        self.faults.fail("dir_fsync", (errno.EIO,))
        if self.faults.happens("rot", self.faults.rate / 2):
            flip_a_byte(final, self.faults.rng)

    def remove_many(self, paths: list[Path]) -> list[bool]:
        gone = []
        for path in paths:
            if self.faults.happens("unlink:EIO", self.faults.rate):
                logging.getLogger("kvtier.store.disk.writer").warning(
                    "injected: cannot remove %s", path
                )
                gone.append(False)
            else:
                gone += super().remove_many([path])
        return gone


#: The readers a store can be given: the native one-call reader (production's, where built)
#: and the Python steps.
READERS: dict[str, type[RecordReader]] = {
    "native-reader": NativeRecordReader,
    "python-reader": RecordReader,
}


def flaky_reader(kind: str, faults: Faults) -> RecordReader:
    """A reader of ``kind`` whose reads fail a random share of the time, or hand back damaged
    bytes: damaged in memory after a read the caller hashes itself (the Python steps), or on
    disk just before a read that hashes what it reads (the native reader), so that the
    damage always lies where the reader's check must see it."""

    class FlakyReader(READERS[kind]):  # type: ignore[misc, valid-type]
        def read_checked(
            self, path: Path, out: memoryview, checksum: bool
        ) -> tuple[memoryview, int | None, bool]:
            faults.fail("read", READ_ERRNOS)
            if self.native and faults.happens("read_bitflip", faults.rate / 2):
                flip_a_byte(path, faults.rng)
            header, payload_checksum, cached = super().read_checked(path, out, checksum)
            if not self.native and faults.happens("read_bitflip", faults.rate / 2):
                out[faults.rng.randrange(out.nbytes)] ^= 0x01
            return header, payload_checksum, cached

    return FlakyReader()


def io_fault_run(
    root: Path, seed: int, ops: int, rate: float, reader: str
) -> tuple[Counter[str], Counter[str]]:
    """Random puts/loads/deletes through a flaky writer and a flaky ``reader`` against a
    model; returns (injected, outcomes)."""
    rng = random.Random(seed)
    faults = Faults(random.Random(seed + 1), rate)
    io = RecordIO(FlakyWriter(faults), flaky_reader(reader, faults))
    model: dict[int, bytes] = {}
    outcomes: Counter[str] = Counter()
    out = aligned_buffer(FUZZ_PAYLOAD)
    with open_fuzz_store(root, io) as store:
        for _ in range(ops):
            i = rng.randrange(FUZZ_KEYS)
            op = rng.random()
            if op < 0.5:
                payload = fuzz_payload(i, rng.getrandbits(48))
                if store.put(fuzz_key(i), payload):
                    model[i] = payload
                    outcomes["put_ok"] += 1
                else:
                    outcomes["put_failed"] += 1
            elif op < 0.9:
                if store.get_into(fuzz_key(i), out):
                    assert bytes(out) == model.get(i), f"key {i}: served bytes it was not given"
                    outcomes["hit"] += 1
                else:
                    outcomes["miss"] += 1
            else:
                store.delete(fuzz_key(i))
                model.pop(i, None)
            assert store.footprint_bytes() <= CAPACITY
        outcomes["quarantined"] = store.stats().quarantined
    return faults.injected, outcomes


# The default run takes production's reader; the slow run each reader at both sizes.
@pytest.mark.parametrize(
    ("seeds", "ops", "reader"),
    [
        pytest.param(3, 1500, "native-reader", id="3x1500-native-reader"),
        pytest.param(3, 1500, "python-reader", id="3x1500-python-reader", marks=pytest.mark.slow),
        pytest.param(20, 2000, "native-reader", id="20x2000-native-reader", marks=pytest.mark.slow),
        pytest.param(20, 2000, "python-reader", id="20x2000-python-reader", marks=pytest.mark.slow),
    ],
)
def test_injected_io_errors_never_serve_wrong_bytes_or_leak_files(
    outside, reliability, seeds: int, ops: int, reader: str
) -> None:
    if reader == "native-reader" and native.record_reader() is None:
        pytest.skip("kvtier.native._recordread is not built")
    injected: Counter[str] = Counter()
    outcomes: Counter[str] = Counter()
    for seed in range(seeds):
        root = outside.cache / f"run{seed}"
        got_injected, got_outcomes = io_fault_run(root, seed, ops, rate=0.08, reader=reader)
        injected += got_injected
        outcomes += got_outcomes
        with open_fuzz_store(root) as store:  # the disk is healthy again
            # only records that rotted on disk and were never read since may be left to find
            problems = store.verify()
            assert {p.kind for p in problems} <= {"corrupt"}, problems
            store.verify(fix=True)
            assert_store_sound(store, CAPACITY)
            for key in list(store.keys()):
                assert payload_ok(int.from_bytes(key[:32], "big"), store.get(key) or b"")
    assert outcomes["hit"] and outcomes["put_ok"] and outcomes["quarantined"]
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(injected.items()))
    reliability.record(
        f"errno injected at the record writer and the {reader.replace('-', ' ')}, "
        f"8% of calls ({kinds})",
        "store",
        seeds * ops,
        f"{outcomes['hit']} hits all equal to the last stored payload, {outcomes['miss']} "
        f"misses, {outcomes['put_failed']} puts refused (False), {outcomes['quarantined']} "
        "records quarantined; never an exception; cap held after every op; healthy reopen: "
        "verify() clean, no orphan or temp file",
    )


# -- full file systems -----------------------------------------------------------------------


def fill_store_until_full(store: DiskStore, limit: int = 400) -> list[int]:
    """Put new keys until three puts in a row are refused; returns the ones stored.

    One refusal is not always the end: undoing it can free index space (a truncating WAL
    checkpoint), so the next put may fit again.
    """
    stored: list[int] = []
    refused = 0
    for i in range(1000, 1000 + limit):
        if store.put(fuzz_key(i), fuzz_payload(i, 1)):
            stored.append(i)
            refused = 0
        else:
            refused += 1
            if refused == 3:
                return stored
    raise AssertionError(f"{limit} puts never filled the file system")


@pytest.mark.parametrize("fs", ["tmpfs", "ext4"])
def test_a_full_file_system_refuses_puts_and_keeps_serving(
    tmp_path: Path, reliability, fs: str
) -> None:
    mount = tmp_path / "mnt"
    context = (
        tmpfs(mount, "3m") if fs == "tmpfs" else ext4_image(mount, tmp_path / "fs.img", 8 << 20)
    )
    with context:
        reserve = mount / "reserve"  # another program's file, deleted later to free space
        reserve.write_bytes(bytes(512 << 10))
        guard = Outside(mount / "parent")
        big_cap = 1 << 30  # far above the file system: only ENOSPC can stop the puts
        store = DiskStore(guard.cache, fuzz_namespace(), big_cap, free_space_floor_bytes=0)
        with store:
            kept = fill_store_until_full(store)
            stored = len(kept)
            assert stored >= 2
            failures = store.stats().put_failures
            for i in kept:  # everything stored before the disk filled is served
                assert store.get(fuzz_key(i)) == fuzz_payload(i, 1)
            for _ in range(5):  # more refusals change nothing
                assert not store.put(fuzz_key(1), fuzz_payload(1, 1))
            assert store.stats().put_failures == failures + 5
            assert_store_sound(store, big_cap, settled=False)
            reserve.unlink()  # room again (with no room at all, even the index cannot change)
            assert store.put(fuzz_key(1), fuzz_payload(1, 2))
            assert store.get(fuzz_key(1)) == fuzz_payload(1, 2)
            assert_store_sound(store, big_cap)
        guard.assert_untouched()
    reliability.record(
        f"file system full (real ENOSPC: {fs}, "
        f"{'3 MiB tmpfs' if fs == 'tmpfs' else '8 MiB loop-mounted ext4, O_DIRECT writes'}; "
        "cap far above it, no floor)",
        "store",
        stored + 6,
        f"{stored} records stored, then every put False (no exception, no temp file left, no "
        "index entry without a file, no reservation left behind); every stored record still "
        "served; once space is freed, puts work again; verify() clean",
    )


def test_free_space_floor_refuses_a_put_before_the_disk_is_full(tmp_path: Path, reliability):
    with tmpfs(tmp_path / "mnt", "4m") as mount:
        guard = Outside(mount / "parent")
        with DiskStore(guard.cache, fuzz_namespace(), 1 << 30) as store:  # default floor: 5%
            for i in range(4):
                assert store.put(fuzz_key(i), fuzz_payload(i, 1))
            balloon = fill(mount, "balloon")  # someone else fills the disk
            assert not store.put(fuzz_key(9), fuzz_payload(9, 1))
            assert store.stats().evictions == 0, "evicting cannot restore the floor: keep all"
            for i in range(4):
                assert store.get(fuzz_key(i)) == fuzz_payload(i, 1)
            balloon.unlink()
            assert store.put(fuzz_key(9), fuzz_payload(9, 1))
            assert_store_sound(store, 1 << 30)
        guard.assert_untouched()
    reliability.record(
        "another program fills the file system under the store (default 5% floor)",
        "store",
        1,
        "put refused without evicting anything (evicting all would not restore the floor); "
        "records still served; puts resume once space is back",
    )


# -- read-only folder --------------------------------------------------------------------------


def test_a_folder_turned_read_only_under_the_store_degrades_to_misses(
    tmp_path: Path, reliability
) -> None:
    from tests.support.faults import need_mounts, unmount

    need_mounts()
    guard = Outside(tmp_path / "parent")
    store = DiskStore(guard.cache, fuzz_namespace(), SMALL_CAPACITY, free_space_floor_bytes=0)
    with store:
        for i in range(4):
            assert store.put(fuzz_key(i), fuzz_payload(i, 1))
        bad = store.record_path(fuzz_key(3))
        assert bad is not None
        with open(bad, "r+b") as f:  # one record rots
            f.seek(FUZZ_RECORD - 1)
            last = f.read(1)[0]
            f.seek(FUZZ_RECORD - 1)
            f.write(bytes([last ^ 0x80]))
        bind_readonly(store.namespace_dir)
        try:
            for i in range(3):
                assert store.get(fuzz_key(i)) == fuzz_payload(i, 1), "reads still served"
            assert store.get(fuzz_key(3)) is None, "the rotten one is a miss..."
            assert not store.contains(fuzz_key(3)), "...and is not offered again"
            assert store.stats().corrupt == {"checksum": 1}
            assert not store.put(fuzz_key(7), fuzz_payload(7, 1)), "a put evicts, then fails"
            assert not store.put(fuzz_key(8), fuzz_payload(8, 1))
        finally:
            unmount(store.namespace_dir)
        # writable again: what could not be unlinked while read-only is not left orphaned
        assert store.put(fuzz_key(9), fuzz_payload(9, 1))
        assert store.get(fuzz_key(9)) == fuzz_payload(9, 1)
        assert_store_sound(store, SMALL_CAPACITY)
    with open_fuzz_store(guard.cache) as again:
        assert_store_sound(again, CAPACITY)
        assert again.get(fuzz_key(9)) == fuzz_payload(9, 1)
    guard.assert_untouched()
    reliability.record(
        "cache folder turned read-only under an open store (ro bind mount): puts that evict, "
        "a rotten record that cannot be moved to quarantine",
        "store",
        1,
        "good records still served; rotten one a miss and never offered again; puts False; "
        "once writable the files evicted or condemned meanwhile are unlinked (no orphan), "
        "verify() clean",
    )


def test_a_read_only_folder_at_open_is_refused_without_touching_it(tmp_path: Path, reliability):
    from tests.support.faults import need_mounts, unmount

    need_mounts()
    guard = Outside(tmp_path / "parent")
    with open_fuzz_store(guard.cache) as store:
        store.put(fuzz_key(1), fuzz_payload(1, 1))
    bind_readonly(guard.cache)
    try:
        with pytest.raises(OSError, match="Read-only file system"):
            open_fuzz_store(guard.cache)
    finally:
        unmount(guard.cache)
    with open_fuzz_store(guard.cache) as store:
        assert store.get(fuzz_key(1)) == fuzz_payload(1, 1)
        assert_store_sound(store, CAPACITY)
    guard.assert_untouched()
    reliability.record(
        "cache folder read-only when the store opens",
        "store",
        1,
        "open raises OSError (EROFS) — the vLLM tier turns that into 'tier disabled', "
        "requests recompute; folder unchanged and usable once writable",
    )


# -- permission denials (real ones: a child without the capabilities that let root bypass them)


def run_without_dac_override(function: str, *args: str) -> str:
    """Run ``tests.support.workers.<function>(*args)`` as uid 0 minus CAP_DAC_OVERRIDE,
    CAP_DAC_READ_SEARCH and CAP_FOWNER, so file modes apply; returns its stdout."""
    import subprocess
    import sys

    from tests.support.host import capability_drop_unavailable, need

    need(capability_drop_unavailable())
    code = f"import sys; from tests.support.workers import {function}; {function}(*sys.argv[1:])"
    done = subprocess.run(
        [
            "setpriv",
            "--bounding-set=-dac_override,-dac_read_search,-fowner",
            sys.executable,
            "-c",
            code,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_permission_denials_under_a_running_store_are_misses_and_refusals(
    outside, reliability
) -> None:
    import json

    from tests.support.workers import (
        BLOCKED,
        FOREIGN,
        LOCKED,
        SHARED,
        UNREADABLE,
        new_in_locked_key,
        perm_key,
    )

    with open_fuzz_store(outside.cache) as store:
        for role in (UNREADABLE, LOCKED, FOREIGN, SHARED):
            assert store.put(perm_key(role), fuzz_payload(role, 1))
        paths = {
            role: store.record_path(perm_key(role))
            for role in (UNREADABLE, LOCKED, FOREIGN, SHARED)
        }
    os.chmod(paths[UNREADABLE], 0)
    os.chown(paths[FOREIGN], 65534, 65534)  # another user's file, readable by us
    os.chmod(paths[FOREIGN], 0o644)
    os.chmod(paths[SHARED], 0o666)  # anybody could have rewritten it
    locked_folder = paths[LOCKED].parent
    os.chmod(locked_folder, 0o500)  # no new names, no unlinks in this fan-out folder
    try:
        got = json.loads(run_without_dac_override("permission_scenario", str(outside.cache)))
    finally:
        os.chmod(locked_folder, 0o700)
    assert got == {
        "get_unreadable": None,  # EACCES on open: a miss, and quarantined
        "get_locked": True,  # a read-only folder still serves its records
        "get_foreign": None,
        "get_shared": None,
        "put_into_locked_folder": False,
        "delete_from_locked_folder": True,  # the row goes; the file stays named in trash
        "put_with_locked_tmp": False,
        "temps_left": 0,
        "corrupt": {"io_error": 1, "not_private": 2},
    }, got
    with open_fuzz_store(outside.cache) as store:  # permissions restored, as root
        assert_store_sound(store, CAPACITY)
        assert list(store.keys()) == []
        assert not paths[LOCKED].exists(), "the file the dead session could not unlink is gone"
        assert store.get(new_in_locked_key()) is None
        assert store.get(perm_key(BLOCKED)) is None
        reasons = sorted(name.split(".")[2] for name in entries(store.namespace_dir))
        assert reasons == ["io_error", "not_private", "not_private"]
    reliability.record(
        "permission denials, real (uid 0 without CAP_DAC_OVERRIDE): record file mode 000, "
        "fan-out folder 0500, tmp/ folder 000; record owned by another user; record mode 0666",
        "store",
        7,
        "unreadable and non-private records: miss + quarantined (io_error, not_private x2); "
        "records in a read-only folder still served; puts into it or with tmp/ locked: False, "
        "no temp left; a delete there keeps the file named in trash, unlinked by the next "
        "open; verify() clean",
    )


# -- focused regressions for the cleanup-failure fixes ---------------------------------------


class StuckUnlinkWriter(RecordWriter):
    """Unlinks of record files fail while ``stuck`` (and publish fails while ``fail_publish``)."""

    def __init__(self) -> None:
        super().__init__()
        self.stuck = False
        self.fail_publish = False

    def remove_many(self, paths: list[Path]) -> list[bool]:
        stuck = [self.stuck and path.suffix == ".kvb" for path in paths]
        free = [path for path, kept in zip(paths, stuck, strict=True) if not kept]
        gone = iter(super().remove_many(free))
        return [False if kept else next(gone) for kept in stuck]

    def publish(self, temp: Path, final: Path) -> None:
        super().publish(temp, final)
        if self.fail_publish:
            raise OSError(errno.EIO, "injected: folder fsync failed after the rename")


def test_an_evicted_file_that_cannot_be_unlinked_stays_named_and_goes_later(
    outside, reliability
) -> None:
    io = StuckUnlinkWriter()
    with open_fuzz_store(outside.cache, RecordIO(io)) as store:
        for i in range(FUZZ_CAPACITY_RECORDS):
            assert store.put(fuzz_key(i), fuzz_payload(i, 1))
        io.stuck = True
        # Evicts, but the unlinks fail: the files stay charged, so the record does not fit.
        assert not store.put(fuzz_key(50), fuzz_payload(50, 1))
        assert store.footprint_bytes() <= CAPACITY
        assert store.verify() == [], "the evicted files are still named (trash), not orphans"
        io.stuck = False
        assert store.put(fuzz_key(51), fuzz_payload(51, 1))  # retried with the next put
        assert_store_sound(store, CAPACITY)
    reliability.record(
        "unlink of evicted record files fails (EIO/EROFS-like)",
        "store",
        1,
        "the files stay named and charged in trash (verify() clean, no orphan, the put that "
        "needed the room refused) and are unlinked with the next put",
    )


def test_a_failed_put_whose_file_cannot_be_unlinked_leaves_no_orphan(outside, reliability) -> None:
    io = StuckUnlinkWriter()
    with open_fuzz_store(outside.cache, RecordIO(io)) as store:
        io.stuck = io.fail_publish = True
        assert not store.put(fuzz_key(1), fuzz_payload(1, 1))  # published, then undone
        # The reservation is dropped; the published file stays charged until it is unlinked.
        assert store.used_bytes() == charge(FUZZ_RECORD)
        assert store.verify() == [], "the published file stays named (trash), not an orphan"
        io.stuck = io.fail_publish = False
        assert store.put(fuzz_key(2), fuzz_payload(2, 1))
        assert_store_sound(store, CAPACITY)
    with open_fuzz_store(outside.cache) as store:
        assert_store_sound(store, CAPACITY)
    reliability.record(
        "put fails after its file was published (folder fsync EIO) and the file cannot be unlinked",
        "store",
        1,
        "put False, reservation dropped, file stays named and charged in trash until unlinked",
    )
