"""The disk root (the user's ``disk_dir``): its settings, its index and its preflight check.

The cap and low watermark are properties of the root, stored in the root's index (``meta``)
and shared by every namespace and process using the folder:

* ``capacity_bytes=None`` adopts the stored cap, or for a new folder ``auto_disk_capacity``.
* An explicit cap that differs from the stored one replaces it for every user of the folder
  (logged once at INFO, old -> new); other open stores read it in their next ``refresh()``
  and the next put of any process evicts down to it (reservations read it in the index
  transaction).

Schema versions: an index of a newer schema is refused (``ConfigError``: upgrade kvtier or
use another folder). Schema 1 kept one index per namespace folder; such folders are migrated
when the root is opened by dropping their cached records and their index (it is a cache: the
blocks are computed again), so no byte under the root escapes the cap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sqlite3
import stat
from pathlib import Path

from kvtier import native
from kvtier.errors import ConfigError
from kvtier.settings import DISK_INDEX_ALLOWANCE_BYTES
from kvtier.store.disk import layout
from kvtier.store.disk.index import (
    ALLOC_UNIT,
    SCHEMA_VERSION,
    WAL_SIZE_LIMIT_BYTES,
    WAL_TXN_BYTES,
    Index,
    SchemaError,
    charge,
    read_schema_version,
)

log = logging.getLogger(__name__)

#: Default cap: this share of the file system holding the folder, at most AUTO_CAPACITY_MAX.
AUTO_CAPACITY_FRACTION = 0.25
AUTO_CAPACITY_MAX = 256 * 2**30
#: The least the index files are charged against the cap (database, WAL, shared memory and
#: the namespace.json files); a constant while they are small, so a cap of N records holds N.
#: Defined with the disk tier's settings, whose smallest cap is derived from it.
INDEX_ALLOWANCE_BYTES = DISK_INDEX_ALLOWANCE_BYTES
#: Growth of the database between two measurements (rows written by a few transactions), and
#: of an engine's decision file and its temp file (16 KiB at most per namespace).
INDEX_GROWTH_MARGIN_BYTES = 192 << 10
_DIGEST_HEX = re.compile(r"^[0-9a-f]{32}$")
_PPM = 1_000_000


def auto_disk_capacity(disk_dir: Path | str) -> int:
    """Default cap for a new folder: a quarter of the file system holding ``disk_dir`` (or
    its nearest existing parent), at most 256 GiB."""
    probe = Path(disk_dir).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return min(int(st.f_blocks * st.f_frsize * AUTO_CAPACITY_FRACTION), AUTO_CAPACITY_MAX)


def effective_capacity(root: Path | str, requested: int | None) -> int:
    """The cap a store opened on ``root`` with ``capacity_bytes=requested`` will use:
    ``requested`` if given, else the folder's stored cap, else ``auto_disk_capacity``.
    Reads the index without creating or changing anything (for sizing before start-up)."""
    if requested is not None:
        return requested
    stored = _read_meta(Path(root).absolute() / layout.INDEX_FILE).get("capacity_bytes")
    return stored if stored is not None else auto_disk_capacity(root)


def index_files_bytes(root: Path, namespaces: int) -> int:
    """What the index files, the namespace.json files and the decision files take now (sizes
    rounded up to 4 KiB, one unit per namespace.json)."""
    index_files = sum(measure_index_files(root)[0].values())
    return index_files + namespaces * ALLOC_UNIT + decision_files_bytes(root)


#: How long a store's measurement of the decision files stands (``decision_files_bytes``).
DECISION_FILES_TTL_S = 1.0


def decision_files_bytes(root: Path) -> int:
    """What the namespaces' decision files (``layout.DECISION_FILE``, written by engines, not
    by the store) take now, sizes rounded up to 4 KiB. Measured at every reservation: an
    engine replaces its file at most every few seconds, by at most ``DECISION_FILE_MAX_BYTES``
    plus its temp file, which the growth margin (``INDEX_GROWTH_MARGIN_BYTES``) covers until
    the next measurement. A store measures at most once per ``DECISION_FILES_TTL_S``: listing
    the root and a stat per namespace at every put would be a large share of a small put's
    time."""
    total = 0
    for name in namespace_folders(root):
        with contextlib.suppress(OSError):
            st = os.lstat(root / name / layout.DECISION_FILE)
            total += charge(st.st_size) if stat.S_ISREG(st.st_mode) else 0
    return total


#: The index files' suffixes after ``layout.INDEX_FILE``: the database, its WAL, its shared memory.
INDEX_SUFFIXES = ("", "-wal", "-shm")


def measure_index_files(
    root: Path, free_space_of: Path | None = None
) -> tuple[dict[str, int], int | None]:
    """The index files' charges by suffix (INDEX_SUFFIXES; 0 for one that does not exist)
    and, with ``free_space_of``, the bytes free to unprivileged users of its file system.

    One native call where the record writer is built (``kvtier.native.file_sizes``): a
    reservation measures both, and the three ``lstat`` and the ``statvfs`` each gave the GIL
    up, four hand-overs a batch of puts where the call gives one (docs/store.md, "What a put
    costs the engine")."""
    paths = [root / f"{layout.INDEX_FILE}{suffix}" for suffix in INDEX_SUFFIXES]
    measure = native.file_sizes()
    if measure is not None:
        space_of = None if free_space_of is None else os.fsencode(free_space_of)
        found, free = measure([os.fsencode(p) for p in paths], space_of)
        sizes = [0 if f is None else charge(f[0]) for f in found]
        return dict(zip(INDEX_SUFFIXES, sizes, strict=True)), free
    charges = {}
    for suffix, path in zip(INDEX_SUFFIXES, paths, strict=True):
        try:
            charges[suffix] = charge(os.lstat(path).st_size)
        except FileNotFoundError:
            charges[suffix] = 0
    if free_space_of is None:
        return charges, None
    st = os.statvfs(free_space_of)
    return charges, st.f_bavail * st.f_frsize


def index_charge(
    root: Path,
    namespaces: int,
    folders_bytes: int = 0,
    decision_bytes: int | None = None,
    sizes: dict[str, int] | None = None,
) -> int:
    """What the index files cost against the cap at a reservation, with room for their
    growth until the next one: the database and shared memory as allocated, the WAL at its
    bound, one allocation unit per namespace.json, the decision files as they are
    (``decision_bytes``: a recent ``decision_files_bytes``, else measured now); plus
    ``folders_bytes`` (what the root's folders take, ``kvtier.store.disk.folders``); at least
    INDEX_ALLOWANCE_BYTES. ``sizes``: the index files' charges just measured
    (``measure_index_files``), else measured now."""
    if sizes is None:
        sizes = measure_index_files(root)[0]
    # Every write transaction starts with the WAL within its limit (Index._write) and adds
    # at most WAL_TXN_BYTES; writers are serialized, so that is the WAL's bound.
    wal_bound = charge(WAL_SIZE_LIMIT_BYTES) + WAL_TXN_BYTES
    measured = (
        sizes[""]
        + sizes["-shm"]
        + max(sizes["-wal"], wal_bound)
        + INDEX_GROWTH_MARGIN_BYTES
        + namespaces * ALLOC_UNIT
        + (decision_files_bytes(root) if decision_bytes is None else decision_bytes)
        + folders_bytes
    )
    return max(measured, INDEX_ALLOWANCE_BYTES)


def namespace_folders(root: Path) -> list[str]:
    """Names of the namespace folders under ``root`` (digest hex), sorted."""
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    return sorted(n for n in names if _DIGEST_HEX.match(n) and (root / n).is_dir())


def open_index(root: Path, session: str, ns: str | None, busy_timeout_s: float) -> Index:
    """Open (creating if needed) the root's index; migrate schema-1 namespace folders.

    A newer schema raises ``ConfigError``; a damaged index is replaced by an empty one and
    every record under the root is removed (its bytes would otherwise escape the cap).
    """
    path = root / layout.INDEX_FILE
    try:
        os.close(layout.open_private_file(path, os.O_RDWR | os.O_CREAT))
    except OSError as exc:
        raise ConfigError(
            f"disk tier: cannot open the index {path} ({exc}); it must be a regular file "
            f"owned by this user: remove it and the store rebuilds an empty one"
        ) from None
    try:
        index = Index(path, session, ns, busy_timeout_s)
    except SchemaError as exc:
        raise _schema_error(path, exc.version) from None
    except sqlite3.DatabaseError as exc:
        if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
            raise
        log.error("disk tier: index %s is damaged (%s); starting an empty one", path, exc)
        for suffix in ("", "-wal", "-shm"):
            path.with_name(path.name + suffix).unlink(missing_ok=True)
        # Its records are now unaccounted for: remove them rather than exceed the cap.
        for name in namespace_folders(root):
            _drop_records(root / name)
        os.close(layout.open_private_file(path, os.O_RDWR | os.O_CREAT))
        index = Index(path, session, ns, busy_timeout_s)
    try:
        for name in namespace_folders(root):
            legacy = root / name / layout.INDEX_FILE
            if legacy.exists():
                log.info("disk tier: %s has a schema-1 index; dropping its records", root / name)
                _drop_records(root / name)
                index.forget_namespace(name)
                for suffix in ("", "-wal", "-shm"):
                    legacy.with_name(legacy.name + suffix).unlink(missing_ok=True)
    except BaseException:
        index.close()
        raise
    return index


def apply_settings(
    index: Index, root: Path, capacity_bytes: int | None, low_watermark: float | None
) -> tuple[int, float]:
    """Make the root's stored settings agree with the explicit ones; return the effective
    (capacity_bytes, low_watermark). None adopts the stored value (or the default)."""
    stored_cap, stored_ppm = index.settings()
    new_cap = capacity_bytes
    if new_cap is None and stored_cap is None:
        new_cap = auto_disk_capacity(root)
    new_ppm = None if low_watermark is None else round(low_watermark * _PPM)
    if new_ppm is None and stored_ppm is None:
        new_ppm = round(0.9 * _PPM)
    if new_cap == stored_cap:
        new_cap = None
    if new_ppm == stored_ppm:
        new_ppm = None
    if new_cap is not None or new_ppm is not None:
        old_cap, old_ppm = index.set_settings(new_cap, new_ppm)
        if new_cap is not None:
            log.info("disk tier: %s capacity %s -> %d bytes", root, old_cap, new_cap)
        if new_ppm is not None and old_ppm is not None:
            log.info("disk tier: %s low watermark %s -> %s", root, old_ppm / _PPM, new_ppm / _PPM)
    cap, ppm = index.settings()
    assert cap is not None and ppm is not None  # set above
    return cap, ppm / _PPM


def check_root(root: Path | str) -> None:
    """Fail-closed preflight of a disk folder, before any namespace is known.

    Raises ``ConfigError`` naming ``disk_dir`` and the fix if the path is a file or a
    symlink, is not writable (probed by creating and removing an entry, so it holds for root,
    who ignores permission bits), belongs to another user, has group/other write permission
    that cannot be removed, or holds an index of a newer schema. Creates nothing that stays:
    a missing folder is left for the store to create, after checking its nearest existing
    parent is a writable folder. Group/other write permission on a folder this user owns is
    removed (chmod 700), as the store would.
    """
    path = Path(root).absolute()
    try:
        st = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        st = None
    except OSError as exc:
        raise ConfigError(
            f"disk_dir={path}: cannot be read ({exc}); give a folder you own"
        ) from None
    if st is None:
        parent = path.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        if not parent.is_dir():
            raise ConfigError(f"disk_dir={path}: {parent} is not a folder; give a folder path")
        _probe_writable(parent, path)
        return
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(
            f"disk_dir={path} is a symlink (to {os.path.realpath(path)}); give the real "
            f"folder so files cannot be redirected"
        )
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"disk_dir={path} is not a folder; give a folder path")
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"disk_dir={path} belongs to uid {st.st_uid}, not this user ({os.geteuid()}); "
            f"use a folder you own, or `chown` it to this user"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        try:
            os.chmod(path, layout.DIR_MODE, follow_symlinks=False)
        except OSError as exc:
            raise ConfigError(
                f"disk_dir={path} is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):#o}) and cannot be fixed ({exc}); run "
                f"`chmod 700 {path}` or use a private folder"
            ) from None
        # Said, not silent: the user's folder changed mode (records in it are still checked
        # one by one: ownership, mode, checksums).
        log.warning(
            "disk tier: disk_dir=%s was writable by group or others (mode %#o); made it "
            "private (chmod %#o)",
            path,
            stat.S_IMODE(st.st_mode),
            layout.DIR_MODE,
        )
    _probe_writable(path, path)
    _check_schema(path / layout.INDEX_FILE)


def _probe_writable(folder: Path, disk_dir: Path) -> None:
    probe = folder / f".kvtier-probe.{os.getpid()}.{os.urandom(4).hex()}"
    try:
        os.mkdir(probe, layout.DIR_MODE)
    except OSError as exc:
        raise ConfigError(
            f"disk_dir={disk_dir}: cannot write in {folder} ({exc.strerror}); give a folder "
            f"this user can write, e.g. one under $HOME"
        ) from None
    with contextlib.suppress(OSError):
        os.rmdir(probe)


def _check_schema(path: Path) -> None:
    version = _read_meta(path).get("schema_version")
    if version is not None and version > SCHEMA_VERSION:
        raise _schema_error(path, version)


def _read_meta(path: Path) -> dict[str, int]:
    """The ``meta`` table of the index at ``path``; {} if absent or unreadable. Creates
    nothing: a read-only connection to a WAL database creates -wal and -shm if they are
    absent, but without them the main file is the whole database, which an immutable
    connection reads as it stands."""
    if not path.exists():
        return {}
    wal = all(os.path.exists(f"{path}{suffix}") for suffix in ("-wal", "-shm"))
    try:
        conn = sqlite3.connect(f"file:{path}?{'mode=ro' if wal else 'immutable=1'}", uri=True)
    except sqlite3.Error:
        return {}
    try:
        if read_schema_version(conn) is None:
            return {}
        return {name: int(value) for name, value in conn.execute("SELECT name, value FROM meta")}
    except sqlite3.Error:
        return {}
    finally:
        conn.close()


def _schema_error(path: Path, version: int) -> ConfigError:
    if version > SCHEMA_VERSION:
        return ConfigError(
            f"disk_dir: {path} has index schema {version}, newer than this kvtier's "
            f"{SCHEMA_VERSION}: a newer kvtier wrote this folder; upgrade kvtier or point "
            f"disk_dir at another folder"
        )
    return ConfigError(
        f"disk_dir: {path} has index schema {version}, which this kvtier cannot migrate; "
        f"remove the folder or point disk_dir at another folder"
    )


def _drop_records(folder: Path) -> None:
    """Remove a namespace folder's records, temp files and quarantine (not the folder)."""
    for sub in (layout.BLOCKS, layout.TMP, layout.QUARANTINE):
        target = folder / sub
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target, ignore_errors=True)
            with contextlib.suppress(OSError):
                layout.make_private_dir(target, "store folder")
