"""Small native helpers, compiled when kvtier is built (never at run time); Python fallbacks.

``_streamcopy`` (the host pool's page copier), ``_recordread`` (the disk tier's one-call
record read and a batch's checksums), ``_recordwrite`` (its one-call record writes and file,
folder and free-space measurements) and ``_sockread`` (the shared
tier's one-call receives) are C extensions built by setup.py: by ``pip install`` (wheel or
sdist) or, for a clone, by scripts/setup.sh (``setup.py build_ext --inplace``, ignored by
git). Nothing here runs a compiler. Each is optional: when one is missing (no C compiler when
kvtier was built, not x86-64 for the copier) or fails to load, callers get ``None``, keep
their Python path, and the log says so once per process.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

log = logging.getLogger(__name__)

#: Signature of ``copy_pages(n, dst, src, sizes) -> bytes copied``: addresses of uint64 arrays.
PageCopier = Callable[[int, int, int, int], int]

#: Signature of ``read_record(path, header, payload, direct, checksum, page_cache)`` ->
#: ``(status, errno, detail, detail2, direct_refused, payload_checksum, from_page_cache)``: see
#: recordread.h.
RecordReader = Callable[
    [bytes, memoryview, memoryview, bool, bool, bool],
    tuple[int, int, int, int, bool, int | None, bool],
]

_MODULE = "kvtier.native._streamcopy"
_READER_MODULE = "kvtier.native._recordread"


def _load(module_name: str, unavailable: str) -> ModuleType | None:
    """Import one native module, or log why not (``unavailable`` says what is used instead)."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        log.warning("kvtier: %s (%s)", unavailable, exc)
        return None


@functools.cache
def page_copier() -> PageCopier | None:
    """The streaming-store page copier (releases the GIL), or None where it was not built.

    Cached per process: the import is tried once and the warning logged once.
    """
    module = _load(
        _MODULE,
        "native page copier unavailable; host pool copies use memmove (slower). It is "
        "compiled when kvtier is installed with a C compiler on x86-64.",
    )
    if module is None:
        return None
    copier: PageCopier = module.copy_pages
    return copier


def copier_name() -> str:
    """Which copier ``page_copier()`` gives, in words, for benchmark reports."""
    if page_copier() is None:
        return "memmove per page: native copier not built"
    return "streaming stores"


@functools.cache
def _reader_module() -> ModuleType | None:
    return _load(
        _READER_MODULE,
        "native record reader unavailable; disk reads use Python's calls, which wait for the "
        "GIL several times per block, and read records the page cache holds from the device "
        "again. It is compiled when kvtier is installed with a C compiler on Linux.",
    )


@functools.cache
def _writer_module() -> ModuleType | None:
    return _load(
        "kvtier.native._recordwrite",
        "record writes run their steps in Python and the disk store measures its folders and "
        "index files and unlinks evicted files one system call at a time",
    )


@functools.cache
def record_reader() -> RecordReader | None:
    """The one-call record reader (releases the GIL once per block), or None where it was not
    built. Cached per process, like ``page_copier``."""
    module = _reader_module()
    if module is None:
        return None
    reader: RecordReader = module.read_record
    return reader


#: ``read_unless_resident(path, header, payload, direct, checksum) -> (fd, status, errno,
#: detail, detail2, direct_refused, payload_checksum)`` and ``read_resident(fd, header, payload,
#: checksum) -> (status, errno, detail, nowait_refused, payload_checksum)``: a read into a buffer
#: claimed in between, when the page cache holds the record (see recordread.h).
ResidentOpener = Callable[
    [bytes, memoryview, memoryview, bool, bool],
    tuple[int, int, int, int, int, bool, int | None],
]
ResidentReader = Callable[
    [int, memoryview, memoryview, bool], tuple[int, int, int, bool, int | None]
]


def resident_reader() -> tuple[ResidentOpener, ResidentReader] | None:
    """The record reader's two halves for reads into a claimed buffer, or None where the
    reader is not built."""
    module = _reader_module()
    if module is None:
        return None
    return module.read_unless_resident, module.read_resident


#: ``read_claiming(path, header, bounce, out, cell, direct, checksum) -> (into, status,
#: errno, detail, detail2, direct_refused, nowait_refused, payload_checksum)``: both halves
#: above in one call, the claim made on ``cell`` between them (see recordread.h).
ClaimingReader = Callable[
    [bytes, memoryview, memoryview, memoryview, bytearray, bool, bool],
    tuple[int, int, int, int, int, bool, bool, int | None],
]


def claiming_reader() -> ClaimingReader | None:
    """The record reader that claims a load's row itself, or None where it is not built."""
    module = _reader_module()
    return None if module is None else module.read_claiming


#: ``read_claiming_many(paths, headers, bounce, outs, cells, direct, checksum) -> [read_claiming's
#: tuple per path]``: ``read_claiming`` of each in turn in one call (one GIL hand-over for the
#: list); ``headers`` holds one header buffer per path, back to back.
ClaimingBatchReader = Callable[
    [list[bytes], memoryview, memoryview, list[memoryview], list[bytearray], bool, bool],
    list[tuple[int, int, int, int, int, bool, bool, int | None]],
]


def claiming_batch_reader() -> ClaimingBatchReader | None:
    """``claiming_reader`` for a list of records in one call, or None where it is not built."""
    module = _reader_module()
    return None if module is None else module.read_claiming_many


#: ``claim_move(cell, from, to) -> moved`` and ``claim_state(cell) -> state``: a claim cell's
#: atomic operations, for the Python side of a load the native reader may claim.
ClaimOps = tuple[Callable[[bytearray, int, int], bool], Callable[[bytearray], int]]


def claim_ops() -> ClaimOps | None:
    """The claim cell's operations, or None where the record reader is not built."""
    module = _reader_module()
    return None if module is None else (module.claim_move, module.claim_state)


def resident(path: str | os.PathLike[str]) -> bool | None:
    """Whether the page cache holds every page of the file at ``path`` (a file of this user),
    asked as the record reader asks it: nothing is read. None where the reader is not built."""
    module = _reader_module()
    return None if module is None else bool(module.resident(path))


def residency_probe() -> str | None:
    """How the record reader asks the kernel about the page cache in this process,
    ``"cachestat"`` or ``"mincore"`` (kernels before 6.5); None where it is not built."""
    module = _reader_module()
    return None if module is None else str(module.residency_probe())


#: Signature of ``xxh3_64_many(buffers) -> [XXH3-64 of each]``, every buffer of at least
#: ``XXH3_MANY_MIN_BYTES``.
ChecksumsMany = Callable[[Sequence[Any]], list[int]]
#: The shortest buffer ``xxh3_64_many`` hashes (its long-input path's floor).
XXH3_MANY_MIN_BYTES = 241


@functools.cache
def xxh3_many() -> ChecksumsMany | None:
    """XXH3-64 of a batch of buffers with the GIL given up once for them all, or None where the
    record reader is not built (or was built before it had this)."""
    module = _reader_module()
    return None if module is None else getattr(module, "xxh3_64_many", None)


#: ``folder_sizes(paths) -> [(st_size, st_blocks) or None]`` and
#: ``subfolder_sizes(path) -> [(name, st_size, st_blocks)] or None``, paths as bytes.
FolderStats = tuple[
    Callable[[Sequence[bytes]], list[tuple[int, int] | None]],
    Callable[[bytes], list[tuple[bytes, int, int]] | None],
]


@functools.cache
def folder_stats() -> FolderStats | None:
    """Folders measured (``lstat``) and listed in one call each with the GIL given up once, or
    None where the record writer is not built (or was built before it had these)."""
    module = _writer_module()
    if module is None or not hasattr(module, "subfolder_sizes"):
        return None
    return module.folder_sizes, module.subfolder_sizes


#: ``file_sizes(paths, free_space_of) -> ([(st_size, st_blocks) or None], free bytes or None)``,
#: paths as bytes: each file's size (None: it does not exist) and the bytes free to unprivileged
#: users of ``free_space_of``'s file system (None when not given).
FileSizes = Callable[
    [Sequence[bytes], bytes | None], tuple[list[tuple[int, int] | None], int | None]
]


@functools.cache
def file_sizes() -> FileSizes | None:
    """Files measured (``lstat``) and a file system's free space (``statvfs``) in one call
    with the GIL given up once, or None where the record writer is not built (or was built
    before it had this)."""
    module = _writer_module()
    return None if module is None else getattr(module, "file_sizes", None)


#: ``unlink_files(paths) -> [errno]``, paths as bytes: per path 0 once it is gone (it may have
#: been already), else the errno that kept it.
FilesUnlinker = Callable[[Sequence[bytes]], list[int]]


@functools.cache
def files_unlinker() -> FilesUnlinker | None:
    """Files unlinked in one call with the GIL given up once, or None where the record writer
    is not built (or was built before it had this)."""
    module = _writer_module()
    return None if module is None else getattr(module, "unlink_files", None)


#: Signature of ``write_records(records, direct, datasync, drop_pages) -> [(status, errno)]``,
#: each record ``(temp, final, header, payload)``: see recordwrite.h; the statuses are
#: ``WriteStatuses``' fields.
RecordsWriter = Callable[[list[tuple[Any, Any, Any, Any]], bool, bool, bool], list[tuple[int, int]]]


class WriteStatuses(NamedTuple):
    """What ``write_records`` says of each record, as the C module numbers it."""

    ok: int
    errno: int
    direct_refused: int
    no_folder: int


@functools.cache
def records_writer() -> tuple[RecordsWriter, WriteStatuses] | None:
    """The one-call record writer (releases the GIL once per batch) and its statuses, or None
    where it was not built. Cached per process."""
    module = _writer_module()
    if module is None:
        return None
    statuses = WriteStatuses(module.OK, module.ERRNO, module.DIRECT_REFUSED, module.NO_FOLDER)
    return module.write_records, statuses


#: Signature of ``recv_exactly(fd, buffers, timeout_ms) -> (status, received, errno)``: see
#: sockread_module.c; the statuses are ``SocketStatuses``' fields.
SocketReceiver = Callable[[int, tuple[memoryview | bytearray, ...], int], tuple[int, int, int]]


class SocketStatuses(NamedTuple):
    """What ``recv_exactly`` and ``exchange_claiming`` say, as the C module numbers it."""

    done: int
    peer_closed: int
    timed_out: int
    error: int
    #: ``exchange_claiming`` only: a reply is not the expected bulk string.
    other_reply: int
    #: ``exchange_claiming`` only: a bulk string does not end in ``\r\n``.
    bad_trailer: int
    #: What became of one GET of ``exchange_claiming`` (the first of its answer's pair): its
    #: value claimed and copied into its out; its value, not claimed (out untouched); a nil;
    #: not sent (its load no longer pending at its turn); sent, its reply not read.
    get_copied: int
    get_not_claimed: int
    get_nil: int
    get_not_sent: int
    get_awaiting: int


_SOCKET_MODULE = "kvtier.native._sockread"


@functools.cache
def _socket_module() -> ModuleType | None:
    return _load(
        _SOCKET_MODULE,
        "native socket reader unavailable; the shared tier reads each record with a GET of "
        "its own and receives it in a Python loop, which waits for the GIL after every chunk. "
        "It is compiled when kvtier is installed with a C compiler.",
    )


@functools.cache
def socket_receiver() -> SocketReceiver | None:
    """The shared tier's one-call receive of a value (releases the GIL once per value), or
    None where it was not built. Cached per process, like ``page_copier``."""
    module = _socket_module()
    if module is None:
        return None
    receiver: SocketReceiver = module.recv_exactly
    return receiver


def socket_statuses() -> SocketStatuses | None:
    """``socket_receiver``'s and ``socket_exchanger``'s statuses by name, or None where the
    module was not built."""
    module = _socket_module()
    if module is None:
        return None
    return SocketStatuses(
        module.RECV_DONE,
        module.RECV_EOF,
        module.RECV_TIMEOUT,
        module.RECV_ERROR,
        module.RECV_OTHER_REPLY,
        module.RECV_BAD_TRAILER,
        module.GET_COPIED,
        module.GET_NOT_CLAIMED,
        module.GET_NIL,
        module.GET_NOT_SENT,
        module.GET_AWAITING,
    )


#: Signature of ``exchange_claiming(fd, requests, lines, headers, bounce, outs, cells, window,
#: checksum, timeout_ms, lock) -> (status, decided, settled, errno, unparsed, answers)``,
#: ``answers`` holding ``(landed, payload_checksum)`` per GET decided, ``lock`` one of
#: ``exchange_lock()`` or None: see sockread_module.c.
SocketExchanger = Callable[
    [
        int,
        list[bytes],
        list[bytes],
        memoryview,
        memoryview,
        list[memoryview],
        list[bytearray],
        int,
        bool,
        int,
        object,
    ],
    tuple[int, int, int, int, bytes, list[tuple[int, int | None]]],
]


def socket_exchanger() -> SocketExchanger | None:
    """The shared tier's one-call exchange of a thread's share of GETs (sent, received,
    hashed, claimed and copied without the GIL), or None where it was not built."""
    module = _socket_module()
    if module is None:
        return None
    exchanger: SocketExchanger = module.exchange_claiming
    return exchanger


def exchange_lock() -> object | None:
    """A new lock for ``socket_exchanger``'s calls, taken and given back without the GIL
    (exchanges given the same lock run one at a time), or None where it was not built."""
    module = _socket_module()
    return None if module is None else module.new_lock()
