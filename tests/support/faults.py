"""Helpers of the fault suite: watched folders, mounts, self-checking payloads, /proc probes.

Kept free of pytest fixtures so spawned or forked helper processes can import it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

from kvtier.format import HEADER_BYTES, Namespace
from kvtier.hostpool.regions import SHM_DIR
from kvtier.store import DiskStore, RecordIO
from kvtier.store.disk.quarantine import entries
from tests.support.host import (
    NOBODY,
    chown_unavailable,
    loop_mount_unavailable,
    mount_unavailable,
    need,
)
from tests.support.store import charged_bytes, disk_capacity, files_under, make_namespace

#: Payload of the store-level fuzzers: 16 pages, so O_DIRECT applies to aligned buffers.
FUZZ_PAYLOAD = 64 << 10
FUZZ_RECORD = HEADER_BYTES + FUZZ_PAYLOAD
FUZZ_KEYS = 24
FUZZ_CAPACITY_RECORDS = 8
#: The fuzz stores' cap: FUZZ_CAPACITY_RECORDS records besides the index files' allowance.
FUZZ_CAPACITY = disk_capacity(FUZZ_CAPACITY_RECORDS, FUZZ_PAYLOAD)


# -- folders -----------------------------------------------------------------------------------


def snapshot(folder: Path, exclude: Path | None = None) -> dict[str, tuple[int, int, int, int]]:
    """relative path -> (mode, uid, size, mtime ns) of everything under ``folder``.

    ``exclude`` (a path under ``folder``) is left out with everything below it.
    """
    found: dict[str, tuple[int, int, int, int]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        here = Path(dirpath)
        if exclude is not None:
            dirnames[:] = [d for d in dirnames if here / d != exclude]
        for name in dirnames + filenames:
            path = here / name
            if path == exclude:
                continue
            st = os.lstat(path)
            size_mtime = (0, 0) if stat.S_ISDIR(st.st_mode) else (st.st_size, st.st_mtime_ns)
            found[str(path.relative_to(folder))] = (st.st_mode, st.st_uid, *size_mtime)
    st = os.lstat(folder)
    found["."] = (st.st_mode, st.st_uid, 0, 0)
    return found


class Outside:
    """A cache folder ``cache`` inside ``parent``, next to a ``sibling`` folder with files.

    ``assert_untouched`` checks that nothing in ``parent`` outside ``cache`` changed: no file
    created, removed, moved, resized, rewritten or re-permissioned.
    """

    def __init__(self, parent: Path, cache_name: str = "cache") -> None:
        self.parent = parent
        self.cache = parent / cache_name
        self.sibling = parent / "sibling"
        self.sibling.mkdir(parents=True, exist_ok=True)
        os.chmod(self.sibling, 0o755)
        (self.sibling / "keep.txt").write_text("not the cache's business\n")
        (self.sibling / "decoy.kvb").write_bytes(bytes(FUZZ_RECORD))
        self.before = snapshot(parent, exclude=self.cache)

    def assert_untouched(self) -> None:
        after = snapshot(self.parent, exclude=self.cache)
        changed = {
            k: (self.before.get(k), after.get(k))
            for k in self.before.keys() | after.keys()
            if self.before.get(k) != after.get(k)
        }
        assert not changed, f"the cache touched things outside its folder: {changed}"


# -- mounts (root only) --------------------------------------------------------------------------


def need_mounts() -> None:
    """Skip unless this process can mount file systems (``tests.support.host``)."""
    need(mount_unavailable())


@contextlib.contextmanager
def tmpfs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of ``size`` (e.g. "4m") on ``path`` for the block; unmounted after."""
    need_mounts()
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)], check=True
    )
    try:
        yield path
    finally:
        unmount(path)


@contextlib.contextmanager
def ext4_image(path: Path, image: Path, size_bytes: int) -> Iterator[Path]:
    """Loop-mount a fresh ext4 file system of ``size_bytes`` on ``path`` for the block."""
    need(loop_mount_unavailable())
    path.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as f:
        f.truncate(size_bytes)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], check=True)
    subprocess.run(["mount", "-o", "loop", str(image), str(path)], check=True)
    try:
        os.chmod(path, 0o755)
        yield path
    finally:
        unmount(path)
        image.unlink(missing_ok=True)


def remount(path: Path, mode: str) -> None:
    """Remount the file system on ``path`` "ro" or "rw"."""
    subprocess.run(["mount", "-o", f"remount,{mode}", str(path)], check=True)


def unmount(path: Path) -> None:
    if subprocess.run(["umount", str(path)], check=False).returncode != 0:
        subprocess.run(["umount", "-l", str(path)], check=True)


def fill(folder: Path, name: str = "balloon") -> Path:
    """Fill the file system holding ``folder`` with one file; returns it (delete to free)."""
    balloon = folder / name
    fd = os.open(balloon, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for chunk in (b"\xab" * (1 << 20), b"\xab" * 4096):  # MiBs, then the last pages
            with contextlib.suppress(OSError):
                while os.write(fd, chunk):
                    pass
    finally:
        os.close(fd)
    return balloon


# -- self-checking payloads ----------------------------------------------------------------------


def fuzz_key(i: int) -> bytes:
    return i.to_bytes(32, "big") + (0).to_bytes(4, "big")


def fuzz_payload(i: int, version: int, size: int = FUZZ_PAYLOAD) -> bytes:
    """Payload naming its key index and version in every 16 bytes."""
    return (i.to_bytes(8, "big") + version.to_bytes(8, "big")) * (size // 16)


def payload_ok(i: int, data: bytes | memoryview) -> bool:
    """True if ``data`` is a whole payload written for key ``i`` (any version)."""
    data = bytes(data)
    if len(data) != FUZZ_PAYLOAD or int.from_bytes(data[:8], "big") != i:
        return False
    return data == fuzz_payload(i, int.from_bytes(data[8:16], "big"))


def fuzz_namespace() -> Namespace:
    return make_namespace(model="faults/fuzz", block_bytes=FUZZ_PAYLOAD)


def open_fuzz_store(root: Path | str, io: RecordIO | None = None) -> DiskStore:
    return DiskStore(
        root,
        fuzz_namespace(),
        FUZZ_CAPACITY,
        free_space_floor_bytes=0,
        io=io,
    )


def block_bytes_on_disk(namespace_dir: Path) -> int:
    return sum(os.lstat(p).st_size for p in files_under(namespace_dir / "blocks"))


def assert_store_sound(store: DiskStore, capacity_bytes: int, settled: bool = True) -> None:
    """Index, files and cap agree; nothing is left to repair; no temp file is left.

    ``capacity_bytes``: the store's cap (index files included). The root's usage is what
    its namespace folders' records and quarantine entries are charged (no trash is left);
    unless ``settled`` is False (a full disk refuses the index writes that release the
    charge of unlinked files): then usage is at least that.
    """
    problems = store.verify()
    assert problems == [], problems
    on_disk = sum(
        charged_bytes(folder / "blocks")
        - charged_bytes_of_dirs(folder / "blocks")
        + charged_bytes(folder / "quarantine")
        for folder in store.root.iterdir()
        if folder.is_dir()
    )
    if settled:
        assert on_disk == store.used_bytes()
    else:
        assert on_disk <= store.used_bytes()
    assert store.footprint_bytes() <= capacity_bytes
    assert files_under(store.namespace_dir / "tmp") == []


# -- engine processes ----------------------------------------------------------------------------


def charged_bytes_of_dirs(folder: Path) -> int:
    """The part of ``charged_bytes(folder)`` that its sub-folders themselves account for."""
    return sum(
        -(-os.lstat(os.path.join(d, n)).st_size // 4096) * 4096
        for d, dirnames, _ in os.walk(folder)
        for n in dirnames
    )


def session_pids(leader: int) -> list[int]:
    """Pids of every live process in the session led by ``leader`` (the engine tree)."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        # fields[0] is the state; session id is field 6 of /proc/pid/stat, here index 3
        if int(fields[3]) == leader and fields[0] != "Z":
            pids.append(int(name))
    return sorted(pids)


def fd_count(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += len(os.listdir(f"/proc/{pid}/fd"))
    return total


def rss_bytes(pids: list[int]) -> int:
    """Sum of resident set sizes (anonymous + file + shmem) of ``pids``, from /proc."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
    return total


def rss_by_role(pids: list[int]) -> dict[str, int]:
    """RSS bytes per process role of an engine tree: "scheduler" (EngineCore, where the disk
    tier lives), "worker" (model runner and kvtier's copy engine), "front" (everything else)."""
    roles: dict[str, int] = {"scheduler": 0, "worker": 0, "front": 0}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        role = (
            "scheduler"
            if comm.startswith("VLLM::EngineCor")
            else "worker"
            if comm.startswith("VLLM::Worker")
            else "front"
        )
        roles[role] += rss_bytes([pid])
    return roles


def region_file(engine_id: str) -> Path:
    return SHM_DIR / f"vllm_offload_{engine_id}.mmap"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_session(leader: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(leader, signal.SIGKILL)


# -- hostile files ---------------------------------------------------------------------------


class Sources:
    """Where damage gets its material: valid records of another key and of another namespace
    (same payload size as the victim), and a file outside the cache folder."""

    def __init__(self, other_key_record, other_namespace_record, outside_file: Path) -> None:  # type: ignore[no-untyped-def]
        #: () -> Path of a valid record of another key, same namespace and size.
        self.other_key_record = other_key_record
        #: (victim key) -> Path of a valid record of the same key in another namespace.
        self.other_namespace_record = other_namespace_record
        #: A file outside the cache folder (a link may point at it; nobody may change it).
        self.outside_file = outside_file


def _flip(path: Path, offset: int) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ 0x04]))


def _replace_with_copy(path: Path, source: Path) -> None:
    data = source.read_bytes()
    tmp = path.with_name(path.name + ".planted")
    tmp.write_bytes(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _hard_link(path: Path, source: Path) -> None:
    path.unlink()
    os.link(source, path)


def _set_version(path: Path, version: int) -> None:
    with open(path, "r+b") as f:
        f.seek(8)
        f.write(version.to_bytes(2, "little"))


def _plant(path: Path, make) -> None:  # type: ignore[no-untyped-def]
    path.unlink()
    make(path)


def _plant_dir(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_bytes(b"x")


def _foreign(path: Path) -> None:
    os.chown(path, NOBODY, NOBODY)
    os.chmod(path, 0o644)


def damages_unavailable() -> dict[str, str]:
    """Damage kinds (keys of ``DAMAGES``) this host cannot apply -> why."""
    reason = chown_unavailable()
    return {} if reason is None else {FOREIGN_DAMAGE: reason}


FOREIGN_DAMAGE = "owned by another user (uid 65534, 0644)"
#: name -> (reasons the store may give, damage(path, rng, sources)).
DAMAGES = {
    "bit flip in the payload": (
        {"checksum"},
        lambda p, rng, s: _flip(p, HEADER_BYTES + rng.randrange(p.stat().st_size - HEADER_BYTES)),
    ),
    "bit flip in the header fields": (
        {"bad_magic", "version", "header_checksum"},
        lambda p, rng, s: _flip(p, rng.randrange(48 + 36 + 8)),
    ),
    "bit flip in the header padding": (
        {"header_checksum"},
        lambda p, rng, s: _flip(p, rng.randrange(48 + 36 + 8, HEADER_BYTES)),
    ),
    "truncated": (
        {"length"},
        lambda p, rng, s: os.truncate(p, rng.randrange(p.stat().st_size)),
    ),
    "extended": (
        {"length"},
        lambda p, rng, s: os.truncate(p, p.stat().st_size + rng.randrange(1, 8192)),
    ),
    "zero-filled": (
        {"bad_magic"},
        lambda p, rng, s: p.write_bytes(bytes(p.stat().st_size)),
    ),
    "wrong header (unknown format version)": (
        {"version"},
        lambda p, rng, s: _set_version(p, 2 + rng.randrange(1000)),
    ),
    "replaced by another key's valid record": (
        {"key"},
        lambda p, rng, s: _replace_with_copy(p, s.other_key_record()),
    ),
    "hard link to another key's valid record": (
        {"key"},
        lambda p, rng, s: _hard_link(p, s.other_key_record()),
    ),
    "replaced by the same key's record of another namespace": (
        {"namespace"},
        lambda p, rng, s: _replace_with_copy(p, s.other_namespace_record(p)),
    ),
    "symlink to a file outside the cache": (
        {"symlink"},
        lambda p, rng, s: _plant(p, lambda q: q.symlink_to(s.outside_file)),
    ),
    "FIFO": ({"not_regular"}, lambda p, rng, s: _plant(p, lambda q: os.mkfifo(q, 0o600))),
    "directory": ({"not_regular"}, lambda p, rng, s: _plant(p, _plant_dir)),
    FOREIGN_DAMAGE: ({"not_private"}, lambda p, rng, s: _foreign(p)),
    "world-writable (0666)": ({"not_private"}, lambda p, rng, s: os.chmod(p, 0o666)),
}


def key_of_record(path: Path) -> bytes:
    """The key a record file is named for (``<key hex>.<id>.kvb``)."""
    return bytes.fromhex(path.name.split(".")[0])


def bind_readonly(folder: Path) -> None:
    """Make ``folder`` read-only for new opens (a ro bind mount over itself); files already
    open for writing (the index) stay writable, as when an admin remounts a volume ro."""
    import subprocess

    subprocess.run(["mount", "--bind", str(folder), str(folder)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], check=True)


def forkserver() -> multiprocessing.context.BaseContext:
    """Children forked from a clean, single-threaded server that has imported the store."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["tests.support.workers"])
    return ctx


def check_after_crashes(root: Path) -> int:
    """Open the folder as a fresh process would and check it; returns the records offered."""
    with open_fuzz_store(root) as store:
        keys = list(store.keys())
        for key in keys:
            data = store.get(key)
            assert data is not None, f"record {key.hex()[:8]} offered but not served"
            assert payload_ok(int.from_bytes(key[:32], "big"), data), "wrong bytes served"
        assert store.stats().corrupt == {}, "a SIGKILL must never leave a corrupt record"
        assert entries(store.namespace_dir) == []
        assert_store_sound(store, FUZZ_CAPACITY)
        locks = [n for n in os.listdir(store.namespace_dir / "sessions") if n.endswith(".lock")]
        assert len(locks) == 1, "dead sessions are reaped"  # (".new" ones after a minute)
    return len(keys)
