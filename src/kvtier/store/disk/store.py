"""``DiskStore``: block records as files on a local file system, shared by processes.

Layout: see kvtier.store.disk.layout. Index (one per root, shared by its namespaces): see
kvtier.store.disk.index. Root settings and preflight: kvtier.store.disk.root. Opening and recovery:
kvtier.store.disk.recovery. Trash: kvtier.store.disk.trash. File I/O: kvtier.store.disk.writer
and kvtier.store.disk.reader.

Writing a record (``put``), and what a crash at each step leaves behind. ``put_many`` writes
a batch of up to PUT_BATCH_MAX records of distinct keys (a longer list is several batches)
through the same steps, each step for the whole batch: one reservation transaction, the
files written and renamed one by one, one commit transaction; so what a crash leaves is what
it leaves of a single put, for each record of the batch. A record whose write fails is
dropped (its reservation and files go to trash) and fails alone; the others commit.

1. Reserve: one index transaction checks the cap, evicts LRU records (of any namespace under
   the root) down to the low watermark if the new record would cross it (their rows leave
   the index, their file names and charge enter ``trash``) and inserts a *pending* row
   charging the record's bytes. Crash after: a pending row of a dead session. The next open
   (or ``refresh``) of any process sees the session's lock is free and moves the row to
   trash, with the record's temp and final names.
2. Unlink the evicted files, then forget their trash entries (only now is their charge
   released). Crash between: trash entries of a dead session; reclaimed like pending rows.
3. Write header + payload into ``tmp/<key>.<id>.<session>.tmp`` (O_EXCL, 0600), fsync per
   policy: charged by the pending row. Crash after: see 1.
4. Rename into ``blocks/``. Crash after: the pending row of a dead session names the file;
   reclaiming the row unlinks it. A file no row names (e.g. after the index was lost) is an
   orphan that ``verify()`` reports and ``verify(fix=True)`` removes.
5. Commit: the row becomes *ready* (and older records of the key go to trash). Only now
   can any process serve it: the file always exists before the index offers it.

A power cut with ``fsync="never"`` may also leave a ready row whose file is empty or torn
(the data was still in the page cache): the read checks catch it, quarantine the file and
miss. Loss of the last index commits (``synchronous=NORMAL``) can leave a ready row without
a file (a clean miss) or a file without a row (an orphan). Neither ever serves wrong data.

Reading (``get_into``): the in-memory map gives the record id; one ``preadv`` fills the
header buffer and the caller's buffer; header and payload checksum are checked. A missing
file is a clean miss (another process evicted the record, or someone deleted it); its row, if
still there, leaves the index. Anything else that fails is quarantined and leaves the index,
so no caller retries it.

Capacity: the cap is the root's (kvtier.store.disk.root) and bounds everything kvtier keeps under
the root at every instant, SIGKILL included: records (pending and ready, so temp files too),
evicted records not unlinked yet (trash), the quarantine, the index files (charged by
``kvtier.store.disk.root.index_charge``) and the folders (``kvtier.store.disk.folders``). Each file
and folder is charged its size rounded up to 4 KiB, so the bound holds for the sum of file
sizes and for ``du -s`` of the root (see docs/store.md). Keys being read by this process are
pinned: eviction skips them.

Sealed records (a ``RecordSealer``, kvtier.format.sealing): the store keeps everything under
each block's *name*, a keyed MAC of the block key, never the key itself: the index, the file
names, the header's key field, the quarantine's labels and the log lines. The caller still
speaks block keys; each method turns one into the names it may be stored under (the write
key's first, then each older key's), so records written before a rotation are still found.
``keys()`` lists only block keys this process has stored or loaded: the names cannot be turned
back into keys, which is the point. The store seals under the sealer it was opened with;
``tenant_view`` gives another tenant's view of the same records, index and cap
(kvtier.store.tenant_view).
"""

from __future__ import annotations

import errno
import functools
import logging
import os
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from kvtier.buffers import copy_into
from kvtier.errors import ConfigError, CorruptRecordError
from kvtier.format.checksum import Buffer, compute_checksums
from kvtier.format.namespace import Namespace
from kvtier.format.record import (
    HEADER_BYTES,
    check_key,
    decode_header,
    encode_header,
    make_header,
    verify_payload,
)
from kvtier.format.sealing import RecordSealer, sealed_namespace
from kvtier.settings import DISK_MIN_CAPACITY_BYTES
from kvtier.store.base import (
    LoadClaim,
    Problem,
    StoreAbilities,
    StoreStats,
    check_put_many,
)
from kvtier.store.disk import check, layout, recovery
from kvtier.store.disk import root as root_settings
from kvtier.store.disk.access_times import AccessTimes
from kvtier.store.disk.folders import FolderCharge
from kvtier.store.disk.index import PUT_BATCH_MAX, TXN_ROWS_MAX, Row, Trashed
from kvtier.store.disk.quarantine import Limits, quarantine
from kvtier.store.disk.reader import ClaimedRead, NativeRecordReader, NowaitRefused
from kvtier.store.disk.record_io import RecordIO
from kvtier.store.disk.session import Session, reap_dead_sessions
from kvtier.store.disk.trash import Trash
from kvtier.store.disk.writer import RecordWriter
from kvtier.store.tenant_view import SealedStore

log = logging.getLogger(__name__)

#: Default free-space floor: this share of the file system, at most FLOOR_MAX_BYTES.
FLOOR_FRACTION = 0.05
FLOOR_MAX_BYTES = 10 << 30
#: Access times are written to the index in batches of this many hits, by a thread of their
#: own (kvtier.store.disk.access_times), or with the next put.
TOUCH_BATCH = 256
#: Reservations tried per put while evicted files of this or other writers are removed,
#: sleeping RESERVE_BACKOFF_S * 2**attempt (at most RESERVE_BACKOFF_MAX_S) when only other
#: writers' files are in the way: a put waits about a second at most before giving up.
RESERVE_ATTEMPTS = 32
RESERVE_BACKOFF_S = 0.001
RESERVE_BACKOFF_MAX_S = 0.05
#: Default quarantine byte limit: this share of the cap.
QUARANTINE_CAP_FRACTION = 0.25
#: Longest a load waits on the index (a quarantine, a dropped row, access times): past it
#: the bookkeeping is skipped (a quarantined file is then removed, its row dropped later) so
#: a load never costs the index's 30 s busy timeout (kvtier.store.disk.index.Index.bounded).
LOAD_INDEX_WAIT_S = 0.5
#: Block keys of sealed records remembered for ``keys()`` (by name); oldest forgotten first.
KNOWN_KEYS_MAX = 1 << 16
#: Errors that say nothing about the record itself: a miss, but no quarantine.
_TRANSIENT = {errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.EINTR, errno.EAGAIN}


@dataclass(slots=True)
class _Put:
    """One record of a batched put, as it goes through the batch."""

    #: Its position in the caller's ``put_many`` (where its outcome goes).
    position: int
    #: The block key, and the name it is stored under (the key itself, or its sealed name).
    key: bytes
    name: bytes
    view: memoryview
    #: Set once reserved: the pending record's id, its temp file and its final file.
    record_id: int = 0
    temp: Path = Path()
    final: Path = Path()

    @property
    def record_bytes(self) -> int:
        return HEADER_BYTES + self.view.nbytes

    def reserved(self, record_id: int, namespace_dir: Path, session_id: str) -> None:
        self.record_id = record_id
        self.final = namespace_dir / layout.record_name(self.name, record_id)
        self.temp = namespace_dir / layout.temp_name(self.name, record_id, session_id)


class _Entry(NamedTuple):
    record_id: int
    payload_len: int
    #: Change-log position that made this entry current (0: loaded at open).
    seq: int


class DiskStore(SealedStore):
    """Persistent, capped, verified block store in ``<root>/<namespace digest>/``.

    Several processes may open the same root (same or other namespaces) at once; they share
    the root's cap and see each other's records after ``refresh()``. See ``BlockStore`` for
    the method contracts and the module docstring for the crash story.
    """

    #: A cap of its own (the folder's); its index knows every key (other processes' after
    #: ``refresh``), so there is no server to ask.
    abilities = StoreAbilities(capacity=True)

    def __init__(
        self,
        root: Path | str,
        namespace: Namespace,
        capacity_bytes: int | None = None,
        free_space_floor_bytes: int | None = None,
        fsync: str = "never",
        *,
        io: RecordIO | None = None,
        low_watermark: float | None = None,
        quarantine_max_entries: int = 64,
        quarantine_max_bytes: int | None = None,
        busy_timeout_s: float = 30.0,
        sealer: RecordSealer | None = None,
    ) -> None:
        """Open (creating if needed) the namespace's folder under ``root``.

        ``capacity_bytes``: cap on everything kvtier keeps under ``root``, all namespaces
        together (records, trash, quarantine, index files; see the module docstring). None
        adopts the root's stored cap, or for a new root ``auto_disk_capacity(root)``; a
        different explicit value replaces the stored one for every user of the root.
        ``low_watermark``: eviction empties down to this share of the cap; None adopts the
        root's (default 0.9), an explicit value replaces it. ``free_space_floor_bytes``: keep
        at least this much free on the file system, evicting if needed; default 5% of the
        file system, at most 10 GiB. ``fsync``: "never", "data" or "always"
        (kvtier.store.disk.writer). ``io``: replaces the file I/O, fsync policy included (the
        fault-injection seam). ``quarantine_max_entries``/``quarantine_max_bytes``: the
        root's quarantine is pruned, oldest first, to these (bytes default: a quarter of the cap).
        ``sealer``: encrypt records and store them under keyed names (module docstring);
        None: plain records, named by their keys.
        Raises ``ConfigError`` for bad values, an unsafe root or an index of a newer schema.
        """
        # The minimum is the settings' (kvtier.settings), so a cap the engine accepted at
        # start-up never fails here, later, on the tier's opener thread.
        if capacity_bytes is not None and capacity_bytes < DISK_MIN_CAPACITY_BYTES:
            raise ConfigError(
                f"disk tier: capacity_bytes={capacity_bytes}; give a size such as '64GiB' "
                f"(at least {DISK_MIN_CAPACITY_BYTES} bytes: the index files are charged "
                "against the cap)"
            )
        if low_watermark is not None and not 0 < low_watermark <= 1:
            raise ConfigError(f"disk tier: low_watermark={low_watermark}; use 0 < x <= 1, e.g. 0.9")
        if sealer is not None:
            namespace = sealed_namespace(namespace)
        self.namespace = namespace
        self._digest = namespace.digest()
        self.root = Path(root).absolute()
        self.namespace_dir = self.root / namespace.digest_hex()
        recovery.prepare_folders(self.root, self.namespace_dir, namespace)
        if free_space_floor_bytes is None:
            st = os.statvfs(self.namespace_dir)
            fs_bytes = st.f_blocks * st.f_frsize
            free_space_floor_bytes = min(int(fs_bytes * FLOOR_FRACTION), FLOOR_MAX_BYTES)
        self.free_space_floor_bytes = free_space_floor_bytes
        self._io = io if io is not None else RecordIO(RecordWriter(fsync))
        self._writer = self._io.writer
        self._reader = self._io.reader
        #: The reader again where it is the native one: the claimed reads are its alone.
        self._native = self._reader if isinstance(self._reader, NativeRecordReader) else None
        self._sealer = sealer
        #: name -> (block key, its tenant's sealer) of sealed records this process stored or
        #: loaded (``keys()``).
        self._known: dict[bytes, tuple[bytes, RecordSealer]] = {}
        self._lock = threading.Lock()
        self._mem: dict[bytes, _Entry] = {}
        self._seq = 0
        self._pins: Counter[bytes] = Counter()
        self._access = AccessTimes(self._write_touches, TOUCH_BATCH, "kvtier-atime")
        self._stats = StoreStats()
        self._closed = False
        self._quarantine_max_entries = quarantine_max_entries
        self._quarantine_max_bytes = quarantine_max_bytes
        self._session = Session(self.namespace_dir)
        self._folders = FolderCharge(self.root)
        self._decision_bytes = 0
        self._decision_bytes_until = 0.0  # monotonic: measure at the first reservation
        try:
            self._index = root_settings.open_index(
                self.root, self._session.session_id, namespace.digest_hex(), busy_timeout_s
            )
        except BaseException:
            self._session.close()
            raise
        try:
            self.capacity_bytes, self.low_watermark = root_settings.apply_settings(
                self._index, self.root, capacity_bytes, low_watermark
            )
            self._namespaces = len(root_settings.namespace_folders(self.root))
            self._trash = Trash(self.root, self._index, self._writer)
            recovery.clean_temp(self.namespace_dir, self._session.session_id, self._writer)
            recovery.reclaim_dead(self.root, self._index, self._trash)
            reap_dead_sessions(self.namespace_dir)
            self._index.trim_changes()
            self._reload()
        except BaseException:
            self._index.close()
            self._session.close()
            raise
        log.info(
            "disk tier: opened %s (%d records; root %d/%d bytes used, floor %d, fsync %s)",
            self.namespace_dir,
            len(self._mem),
            self.used_bytes(),
            self.capacity_bytes,
            free_space_floor_bytes,
            self._io.fsync,
        )

    # -- BlockStore --------------------------------------------------------------------------

    def _put(self, sealer: RecordSealer | None, key: bytes, payload: Buffer) -> bool:
        return self._put_many(sealer, [key], [payload])[0]

    def _put_many(
        self, sealer: RecordSealer | None, keys: Sequence[bytes], payloads: Sequence[Buffer]
    ) -> list[bool]:
        """``put`` of each record, in batches of at most PUT_BATCH_MAX records of distinct
        keys: one reservation and one commit per batch (module docstring)."""
        check_put_many(keys, payloads)
        for key in keys:
            check_key(key)
        outcomes = [False] * len(keys)
        batch: list[_Put] = []
        for i, (key, payload) in enumerate(zip(keys, payloads, strict=True)):
            name = key if sealer is None else sealer.name(self._digest, key)
            # A key twice in one batch would be committed twice at once: it starts the next.
            if len(batch) == PUT_BATCH_MAX or any(p.name == name for p in batch):
                self._put_batch(sealer, batch, outcomes)
                batch = []
            batch.append(_Put(i, key, name, memoryview(payload)))
        if batch:
            self._put_batch(sealer, batch, outcomes)
        return outcomes

    def _put_batch(
        self, sealer: RecordSealer | None, batch: list[_Put], outcomes: list[bool]
    ) -> None:
        """Reserve, write, publish and commit ``batch`` (distinct names); each record's
        outcome goes to ``outcomes`` at its position. A record that fails is a failed put;
        the others still land."""
        if self._closed:
            self._puts_failed(batch, "closed")
            return
        # No block is empty: an empty payload is a caller's slice gone wrong (a row past the
        # end of its pool), and its record would shadow the key's good ones.
        empty = [p for p in batch if not p.view.nbytes]
        if empty:
            self._puts_failed(empty, "empty payload")
            batch = [p for p in batch if p.view.nbytes]
        if not batch:
            return
        if self._trash.has_retries():
            self._trash.retry()
        reserved = self._reserve(batch)
        try:
            written = self._write_records(sealer, reserved)
            self._folders.note_put(*{path.parent for p in written for path in (p.final, p.temp)})
            self._commit(written, outcomes)
        except BaseException:
            # A bug or an interrupt mid-batch: nothing reserved may stay pending in a live
            # session (its bytes would stay charged until the process ends).
            for p in reserved:
                if not outcomes[p.position]:
                    self._trash.discard_write(p.record_id, p.temp, p.final)
            raise

    def _reserve(self, batch: list[_Put]) -> list[_Put]:
        """Reserve ``batch``'s records (their ``record_id`` set); returns those reserved, the
        others counted as failed puts. Asked again while evicted files of this or other
        writers are removed (RESERVE_ATTEMPTS)."""
        waiting = batch
        reserved: list[_Put] = []
        for attempt in range(RESERVE_ATTEMPTS):
            try:
                reservation = self._index.reserve(
                    [(p.name, p.record_bytes) for p in waiting],
                    functools.partial(self._measure, len(waiting)),
                    self._pinned(),
                    self._access.take(TXN_ROWS_MAX + 1 - len(waiting)),
                )
            except (sqlite3.Error, OSError) as exc:
                self._puts_failed(waiting, f"index: {exc}")
                return reserved
            for why in set(reservation.refused.values()):
                self._puts_failed(
                    [p for i, p in enumerate(waiting) if reservation.refused.get(i) == why], why
                )
            self._forget_rows(reservation.evicted)
            self._bump(evictions=len(reservation.evicted))
            # Evicted bytes stay charged until their files are gone: unlink, then ask again.
            self._trash.empty(Trashed(r.path, "") for r in reservation.evicted)
            later = []
            for i, (p, record_id) in enumerate(zip(waiting, reservation.record_ids, strict=True)):
                if record_id is not None:
                    p.reserved(record_id, self.namespace_dir, self._session.session_id)
                    reserved.append(p)
                elif i not in reservation.refused:
                    later.append(p)
            waiting = later
            if not waiting:
                return reserved
            if not reservation.evicted:  # other writers' evicted files are still going
                time.sleep(min(RESERVE_BACKOFF_S * 2**attempt, RESERVE_BACKOFF_MAX_S))
        self._puts_failed(waiting, "no room: evicted files are still being removed")
        return reserved

    def _write_records(self, sealer: RecordSealer | None, batch: list[_Put]) -> list[_Put]:
        """Checksum or seal each record's payload, write its temp file and publish it; returns
        those written, the others' reservations dropped and their puts counted failed.

        Unsealed, the batch's files go to the writer in one call (one GIL hand-over where the
        native writer is built); sealed, one call per record, sealed just before its write:
        the ciphertext lies in the thread's one buffer (kvtier.format.sealing)."""
        if sealer is None:
            checksums = compute_checksums([p.view for p in batch])
            headers = [
                encode_header(make_header(self._digest, p.name, p.view, payload_checksum=c))
                for p, c in zip(batch, checksums, strict=True)
            ]
            records = [(p.temp, p.final, h, p.view) for p, h in zip(batch, headers, strict=True)]
            errors = self._writer.write_records(records)
        else:
            errors = []
            for p in batch:
                sealed, view = sealer.seal(self._digest, p.name, p.view)
                self._remember(p.name, p.key, sealer)
                header = encode_header(sealed)
                errors += self._writer.write_records([(p.temp, p.final, header, view)])
        written = []
        for p, error in zip(batch, errors, strict=True):
            if error is None:
                written.append(p)
            else:
                self._discard(p, str(error))
        return written

    def _commit(self, written: list[_Put], outcomes: list[bool]) -> None:
        """Make ``written`` servable in one index transaction; each committed record's
        outcome set True in ``outcomes``."""
        if not written:
            return
        try:
            committed = self._index.commit([(p.record_id, p.name) for p in written])
        except sqlite3.Error as exc:
            for p in written:
                self._discard(p, str(exc))
            return
        landed = []
        for p, seq in zip(written, committed.seqs, strict=True):
            if seq is None:
                self._discard(p, "reservation was reclaimed")
                continue
            landed.append((p, seq))
            outcomes[p.position] = True
        with self._lock:
            for p, seq in landed:
                current = self._mem.get(p.name)
                if current is None or current.seq < seq:
                    self._mem[p.name] = _Entry(p.record_id, p.view.nbytes, seq)
            self._stats.puts += len(landed)
            self._stats.bytes_written += sum(p.record_bytes for p, _ in landed)
        self._trash.empty(Trashed(r.path, "") for r in committed.superseded)

    def _discard(self, p: _Put, why: str) -> None:
        """A reserved record that will not land: its reservation and files go."""
        self._trash.discard_write(p.record_id, p.temp, p.final)
        self._puts_failed([p], why)

    def _get_into(self, sealer: RecordSealer | None, key: bytes, out: memoryview) -> bool:
        return self._load(sealer, key, memoryview(out), None, None)

    def _get_into_when(
        self,
        sealer: RecordSealer | None,
        key: bytes,
        out: memoryview,
        claim: LoadClaim,
        bounce: memoryview,
    ) -> bool:
        """``get_into`` that writes ``out`` only after ``claim.claim()`` returned True.

        A record the page cache holds whole is read straight into ``out`` once claimed,
        hashed chunk by chunk as it lands: one copy where the bounce buffer costs two and a
        second pass for the checksum. That read never waits for the device (a page evicted
        meanwhile ends it as a miss), so a claim lasts no longer than a copy, as with the
        bounce buffer. The difference: a claimed read that fails (evicted page, bad checksum)
        leaves ``out`` partly written; the load fails, and vLLM frees a failed load's row
        without reading it. Any other record goes through ``bounce`` as ``BlockStore``'s.
        When ``claim`` carries a ``native_cell`` (``AbandonableLoad``), the native reader
        makes the claim itself, in the same call: before reading a record the page cache
        holds, after reading any other into ``bounce`` (then copying it into ``out``). One GIL
        hand-over per block instead of two; each can wait out the switch interval beside a
        busy Python thread.

        A sealed record is always read into ``bounce`` and opened (decrypted) there, before
        the claim: opened in ``out`` it would be written after its load was marked written,
        when the scheduler may already have abandoned the load and vLLM reused the row.
        """
        out = memoryview(out)
        if sealer is None and self._native is not None and self._native.reads_resident_into(out):
            try:
                return self._load(sealer, key, out, claim, bounce)
            except NowaitRefused:
                return self._read_refused_again(sealer, key, out, claim, bounce)
        return self._bounced(sealer, key, out, claim, bounce)

    def _bounced(
        self,
        sealer: RecordSealer | None,
        key: bytes,
        out: memoryview,
        claim: LoadClaim,
        bounce: memoryview,
    ) -> bool:
        """``BlockStore.get_into_when``: read and checked in ``bounce``, copied into ``out``
        once claimed."""
        if not self._load(sealer, key, memoryview(bounce), None, None):
            return False
        if not claim.claim():
            return False
        copy_into(out, bounce)
        claim.written()
        return True

    def _read_refused_again(
        self,
        sealer: RecordSealer | None,
        key: bytes,
        out: memoryview,
        claim: LoadClaim,
        bounce: memoryview,
    ) -> bool:
        """After ``NowaitRefused`` (claimed, nothing read; the reader takes the bounce buffer
        from now on): give the claim back and read the record that way, rather than lose the
        load. On tmpfs every record is resident, so every load in flight meets the refusal
        once. A claim that cannot be given back was spent: a miss."""
        if not claim.release():
            return self._missed()
        return self._bounced(sealer, key, out, claim, bounce)

    def _get_many_into_when(
        self,
        sealer: RecordSealer | None,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        claims: Sequence[LoadClaim],
        bounce: memoryview,
    ) -> list[bool]:
        """``get_into_when`` of each key, the records read in one native call for them all
        when every claim carries a claim cell (``AbandonableLoad``): one GIL hand-over for
        the list instead of one per block, each of which can wait out the interpreter's
        switch interval beside a busy Python thread (an engine's loop). Claimed, read and
        verified in turn, so a load abandoned meanwhile is never read into. Sealed records
        go one by one through ``get_into_when`` (opened before their claim)."""
        outs = [memoryview(out) for out in outs]
        cells = [claim.native_cell for claim in claims]
        native = self._native
        if (
            len(keys) < 2
            or sealer is not None
            or native is None
            or any(cell is None for cell in cells)
            or any(out.nbytes != bounce.nbytes or not native.claims_into(out) for out in outs)
        ):
            return super()._get_many_into_when(sealer, keys, outs, claims, bounce)
        answers = [False] * len(keys)
        batch: list[tuple[int, bytes, _Entry]] = []  # (index, stored name, entry)
        for i, key in enumerate(keys):
            pinned = self._pin(sealer, key, outs[i])
            if pinned is not None:
                batch.append((i, *pinned))
        if not batch:
            return answers
        refused: list[int] = []
        settled = 0
        try:
            reads = native.read_claiming_many(
                [self._path_of(name, entry) for _, name, entry in batch],
                bounce,
                [outs[i] for i, _, _ in batch],
                [cells[i] for i, _, _ in batch],  # type: ignore[misc]
                True,  # plain records only (checked above)
            )
            for (i, name, entry), read in zip(batch, reads, strict=True):
                settled += 1  # _settle unpins, whatever it raises
                try:
                    answers[i] = self._settle(
                        sealer,
                        keys[i],
                        name,
                        entry,
                        outs[i],
                        claims[i],
                        lambda read=read, out=outs[i]: _outcome(read, only_into=out),
                    )
                except NowaitRefused:
                    refused.append(i)
        finally:
            for _, name, _ in batch[settled:]:
                self._unpin(name)
        for i in refused:
            answers[i] = self._read_refused_again(sealer, keys[i], outs[i], claims[i], bounce)
        return answers

    def _load(
        self,
        sealer: RecordSealer | None,
        key: bytes,
        out: memoryview,
        claim: LoadClaim | None,
        bounce: memoryview | None,
    ) -> bool:
        """``get_into``, or with ``claim`` and ``bounce`` ``get_into_when``'s read: in one
        native call when ``claim`` carries a claim cell, else the resident read around a
        Python claim."""
        pinned = self._pin(sealer, key, out)
        if pinned is None:
            return False
        name, entry = pinned
        path = self._path_of(name, entry)
        checksum = sealer is None
        # A claim with a native cell (kvtier.dataplane.abandonable) the reader can make itself.
        native = self._native
        cell = None
        if claim is not None and bounce is not None and bounce.nbytes == out.nbytes:
            cell = claim.native_cell if native is not None and native.claims_into(out) else None

        def read() -> ClaimedRead | bool | None:
            if claim is None or bounce is None:
                header_bytes, payload_checksum, cached = self._reader.read_checked(
                    path, out, checksum
                )
                return ClaimedRead(out, header_bytes, payload_checksum, cached)
            # A claimed load comes here only where the native reader reads resident records
            # (get_into_when); any other goes through the bounce buffer (BlockStore's).
            assert native is not None
            if cell is not None:  # the native reader claims, in the same call as its read
                return _outcome(native.read_claiming(path, bounce, out, cell, checksum))
            opened = native.read_unless_resident(path, bounce, checksum)
            if not isinstance(opened, int):
                return ClaimedRead(bounce, *opened, False)
            # Resident: nothing read yet; read straight into out once claimed.
            if not claim.claim():
                os.close(opened)
                return False
            try:
                resident = native.read_resident(opened, path, out, checksum)
            finally:
                claim.written()
            return None if resident is None else ClaimedRead(out, *resident, True)

        return self._settle(sealer, key, name, entry, out, claim, read)

    def _pin(
        self, sealer: RecordSealer | None, key: bytes, out: memoryview
    ) -> tuple[bytes, _Entry] | None:
        """The name ``key`` is stored under and its entry, pinned (no eviction removes the
        file until ``_settle`` unpins it); None, counted as a miss, when it is not stored or
        not of ``out``'s size."""
        with self._lock:
            name, entry = self._find(sealer, key)
            if entry is None or out.nbytes != entry.payload_len:
                self._stats.misses += 1
                return None
            self._pins[name] += 1
            return name, entry

    def _unpin(self, name: bytes) -> None:
        with self._lock:
            self._pins[name] -= 1
            if not self._pins[name]:
                del self._pins[name]

    def _path_of(self, name: bytes, entry: _Entry) -> Path:
        return self.namespace_dir / layout.record_name(name, entry.record_id)

    def _settle(
        self,
        sealer: RecordSealer | None,
        block_key: bytes,
        key: bytes,
        entry: _Entry,
        out: memoryview,
        claim: LoadClaim | None,
        read: Callable[[], ClaimedRead | bool | None],
    ) -> bool:
        """Run ``read`` (a pinned record's read: what it read, False when the load was
        abandoned before anything was read, None when a page left the page cache during a
        claimed read), check what it read, count it, quarantine a bad record, unpin ``key``,
        and copy into ``out`` once claimed when it was read elsewhere."""
        try:
            landed = read()
            if landed is None:
                return self._missed()
            if isinstance(landed, bool):
                return False  # abandoned: out untouched
            if landed.into is out and claim is not None and claim.abandoned:
                # Written, then abandoned at the deadline: the row is vLLM's again (it may be
                # reused already), so it is neither served nor checked.
                return False
            header = decode_header(landed.header, self._digest, key, entry.payload_len)
            if sealer is None:
                verify_payload(header, landed.into, landed.payload_checksum)
            else:  # in place; the tag covers every byte
                sealer.open(header, landed.into, landed.into)
        except FileNotFoundError:
            # Evicted or replaced by another process (its row is already gone), or deleted
            # behind the store's back: drop the row too, so its bytes leave the cap and no
            # later refresh (which replays this record's commit) offers the key again.
            with self._index.bounded(LOAD_INDEX_WAIT_S):
                self._drop_missing(key, entry.record_id)
            return self._missed()
        except CorruptRecordError as exc:
            with self._index.bounded(LOAD_INDEX_WAIT_S):
                self._quarantine(key, entry.record_id, exc.reason, str(exc))
            return self._missed()
        except OSError as exc:
            if exc.errno in _TRANSIENT:
                log.warning(
                    "disk tier: read of %s failed, will retry later: %s",
                    layout.record_name(key, entry.record_id),
                    exc,
                )
            else:
                with self._index.bounded(LOAD_INDEX_WAIT_S):
                    self._quarantine(key, entry.record_id, "io_error", str(exc))
            return self._missed()
        finally:
            self._unpin(key)
        if sealer is not None:
            self._remember(key, block_key, sealer)
        with self._lock:
            self._stats.hits += 1
            self._stats.page_cache_hits += landed.from_page_cache
            self._stats.bytes_read += entry.payload_len
        self._access.note(key)
        if landed.into is out:
            return True
        # Read into the bounce buffer: checked all the same (a damaged record is quarantined
        # even for a load abandoned after its read), written to out only once claimed.
        assert claim is not None
        if not claim.claim():
            return False
        copy_into(out, landed.into)
        claim.written()
        return True

    def _contains(self, sealer: RecordSealer | None, key: bytes) -> bool:
        if sealer is None:
            return key in self._mem
        return self._find(sealer, key)[1] is not None

    def _delete(self, sealer: RecordSealer | None, key: bytes) -> bool:
        check_key(key)
        if self._closed:
            return False
        names = [key] if sealer is None else sealer.names(self._digest, key)
        rows = []
        try:
            for name in names:
                rows += self._index.remove_key(name)
        except sqlite3.Error as exc:
            log.warning("disk tier: delete failed: %s", exc)
            return False
        with self._lock:
            for name in names:
                self._mem.pop(name, None)
                self._known.pop(name, None)
        self._trash.empty(Trashed(r.path, "") for r in rows)
        return bool(rows)

    def _keys(self, sealer: RecordSealer | None) -> Iterator[bytes]:
        """For sealed records, the block keys of ``sealer``'s tenant this process stored or
        loaded (a name cannot be turned back into its key)."""
        with self._lock:
            if sealer is None:
                return iter(list(self._mem))
            return iter(
                [
                    key
                    for name, (key, owner) in self._known.items()
                    if owner is sealer and name in self._mem
                ]
            )

    def _payload_len(self, sealer: RecordSealer | None, key: bytes) -> int | None:
        entry = self._find(sealer, key)[1]
        return None if entry is None else entry.payload_len

    def used_bytes(self) -> int:
        """Charge of the root's records, trash and quarantine, all namespaces (each file's
        size rounded up to 4 KiB); ``footprint_bytes`` adds the index files."""
        if self._closed:
            return 0
        try:
            return self._index.used_bytes()
        except sqlite3.Error as exc:
            log.warning("disk tier: index unreadable, usage unknown: %s", exc)
            return self.capacity_bytes

    def footprint_bytes(self) -> int:
        """What the cap bounds, now: ``used_bytes`` plus what the index files, the
        namespace.json files and the folders take (reservations charge those at a bound with
        room to grow, ``kvtier.store.disk.root.index_charge``)."""
        return (
            self.used_bytes()
            + root_settings.index_files_bytes(self.root, self._namespaces)
            + self._folders.measure()
        )

    def stats(self) -> StoreStats:
        with self._lock:
            return self._stats.copy()

    def refresh(self) -> int:
        """Apply other processes' changes to the in-memory map, pick up the root's settings
        and reclaim dead writers.

        Costs a few indexed queries when nothing changed; returns the number of changes seen.
        """
        if self._closed:
            return 0
        try:
            self._read_settings()
            self._namespaces = len(root_settings.namespace_folders(self.root))
            recovery.reclaim_dead(self.root, self._index, self._trash)
            found = self._index.changes_since(self._seq)
            if found is None:
                return self._reload()
        except (sqlite3.Error, OSError) as exc:
            log.warning("disk tier: refresh failed, keeping the current view: %s", exc)
            return 0
        changes, top = found
        with self._lock:
            for change in changes:
                current = self._mem.get(change.key)
                if change.ready and (current is None or current.seq < change.seq):
                    self._mem[change.key] = _Entry(change.record_id, change.payload_len, change.seq)
                elif not change.ready and current and current.record_id == change.record_id:
                    del self._mem[change.key]
            self._seq = max(self._seq, top)
        return len(changes)

    def verify(
        self,
        fix: bool = False,
        *,
        progress: Callable[[int], None] | None = None,
        unopened: Callable[[bytes], None] | None = None,
        unauthenticated: Callable[[bytes], None] | None = None,
    ) -> list[Problem]:
        """See ``BlockStore.verify``; ``progress`` is called with the bytes of each record
        read. A sealed record is authenticated with the store's sealer; a store without one
        checks its header and ciphertext checksum only and calls ``unopened`` with its key id
        (it could not check what the record decrypts to). A sealed record whose checksums
        hold but whose tag fails under the sealer's tenant may be another tenant's
        (kvtier.store.tenant_view): ``fix`` leaves it, and it is passed by name to
        ``unauthenticated`` when given, else reported as ``unauthenticated``."""
        return self._verify(
            self._sealer,
            fix,
            progress=progress,
            unopened=unopened,
            unauthenticated=unauthenticated,
        )

    def _verify(
        self,
        sealer: RecordSealer | None,
        fix: bool,
        *,
        progress: Callable[[int], None] | None = None,
        unopened: Callable[[bytes], None] | None = None,
        unauthenticated: Callable[[bytes], None] | None = None,
    ) -> list[Problem]:
        if self._closed:
            raise ValueError("verify() on a closed store; open it again")
        self._access.flush()
        problems = check.StoreCheck(
            self.root,
            self.namespace,
            self._index,
            self._reader,
            self._session.session_id,
            self._quarantine_limits(),
            fix,
            progress,
            sealer,
            unopened,
            unauthenticated,
        ).run()
        if fix:
            self._reload()
        return problems

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._mem = {}
        self._access.close()
        self._index.close()
        self._session.close()

    # -- extras ------------------------------------------------------------------------------

    def record_path(self, key: bytes) -> Path | None:
        """The file currently holding ``key``'s record (as this process knows it), or None."""
        key, entry = self._find(self._sealer, key)
        if entry is None:
            return None
        return self.namespace_dir / layout.record_name(key, entry.record_id)

    # -- internals ---------------------------------------------------------------------------

    def _find(self, sealer: RecordSealer | None, key: bytes) -> tuple[bytes, _Entry | None]:
        """The name ``key`` is stored under here by ``sealer``'s tenant, and its entry (None:
        not stored)."""
        if self._closed:
            return key, None
        if sealer is None:
            return key, self._mem.get(key)
        names = sealer.names(self._digest, key)
        for name in names:
            entry = self._mem.get(name)
            if entry is not None:
                return name, entry
        return names[0], None

    def _remember(self, name: bytes, block_key: bytes, sealer: RecordSealer) -> None:
        with self._lock:
            self._known.pop(name, None)
            self._known[name] = (block_key, sealer)
            if len(self._known) > KNOWN_KEYS_MAX:
                del self._known[next(iter(self._known))]

    def _read_settings(self) -> None:
        capacity, ppm = self._index.settings()
        if capacity is not None and capacity != self.capacity_bytes:
            log.info(
                "disk tier: %s capacity %d -> %d bytes (set by another store)",
                self.root,
                self.capacity_bytes,
                capacity,
            )
            self.capacity_bytes = capacity
        if ppm is not None:
            self.low_watermark = ppm / 1_000_000

    def _measure(self, puts: int) -> tuple[int, int | None]:
        """What a reservation of ``puts`` records needs measured (once per batch, holding the
        index's write lock): ``index_charge``, and the free bytes above the free-space floor
        (negative: below it; None without a floor). The index files and the free space are
        measured in one call (``measure_index_files``); the decision files once per TTL, not
        each time (a benign race between I/O threads measures twice)."""
        floor = self.free_space_floor_bytes
        sizes, free = root_settings.measure_index_files(
            self.root, self.namespace_dir if floor > 0 else None
        )
        now = time.monotonic()
        if now >= self._decision_bytes_until:
            self._decision_bytes = root_settings.decision_files_bytes(self.root)
            self._decision_bytes_until = now + root_settings.DECISION_FILES_TTL_S
        overhead = root_settings.index_charge(
            self.root, self._namespaces, self._folders.charge(puts), self._decision_bytes, sizes
        )
        return overhead, None if free is None else free - floor

    def _quarantine_limits(self) -> Limits:
        max_bytes = self._quarantine_max_bytes
        if max_bytes is None:
            max_bytes = int(self.capacity_bytes * QUARANTINE_CAP_FRACTION)
        return Limits(self._quarantine_max_entries, max_bytes)

    def _reload(self) -> int:
        rows, seq = self._index.load_ready()
        make = _Entry._make
        mem = {key: make((record_id, size, 0)) for key, record_id, size in rows}
        with self._lock:
            self._mem, self._seq = mem, seq
        return len(mem)

    def _quarantine(self, key: bytes, record_id: int, reason: str, detail: str) -> None:
        relative = f"{self.namespace_dir.name}/{layout.record_name(key, record_id)}"
        moved = quarantine(
            self.root,
            self._index,
            relative,
            f"{key.hex()}.{record_id}",
            reason,
            detail,
            self._quarantine_limits(),
            record_id,
        )
        if moved is None:
            # Gone, or removed: drop the row. Neither moved nor removed (read-only folder):
            # keep the file named, in trash.
            stuck = os.path.lexists(self.root / relative)
            try:
                self._index.remove_records([record_id], trash=stuck)
            except sqlite3.Error as exc:
                log.warning("disk tier: could not drop quarantined record from the index: %s", exc)
            else:
                if stuck:
                    self._trash.keep(relative)
        self._forget(key, record_id)
        with self._lock:
            self._stats.corrupt[reason] = self._stats.corrupt.get(reason, 0) + 1
            self._stats.quarantined += moved is not None

    def _pinned(self) -> set[bytes]:
        with self._lock:
            return set(self._pins)

    def _write_touches(self, touches: dict[bytes, int]) -> None:
        """AccessTimes' writer: bounded like the load path's other index calls, as a close
        must not wait out the index's busy timeout for access times."""
        try:
            with self._index.bounded(LOAD_INDEX_WAIT_S):
                self._index.touch(touches)
        except sqlite3.Error as exc:
            log.debug("disk tier: access times not recorded: %s", exc)

    def _forget(self, key: bytes, record_id: int) -> None:
        with self._lock:
            entry = self._mem.get(key)
            if entry is not None and entry.record_id == record_id:
                del self._mem[key]

    def _drop_missing(self, key: bytes, record_id: int) -> None:
        try:
            self._index.remove_records([record_id])
        except sqlite3.Error as exc:
            log.warning("disk tier: could not drop a record whose file is gone: %s", exc)
        self._forget(key, record_id)

    def _forget_rows(self, rows: list[Row]) -> None:
        own = self.namespace_dir.name
        for row in rows:
            if row.ns == own:
                self._forget(row.key, row.record_id)

    def _missed(self) -> bool:
        self._bump(misses=1)
        return False

    def _puts_failed(self, failed: list[_Put], why: str) -> None:
        """Count ``failed`` as failed puts; one warning for them all."""
        if not failed:
            return
        more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
        log.warning("disk tier: put of %s%s failed: %s", failed[0].name.hex()[:16], more, why)
        self._bump(put_failures=len(failed))

    def _bump(self, **increments: int) -> None:
        with self._lock:
            for name, value in increments.items():
                setattr(self._stats, name, getattr(self._stats, name) + value)


def _outcome(
    read: ClaimedRead | Exception | None, only_into: memoryview | None = None
) -> ClaimedRead | bool | None:
    """A claimed read (``NativeRecordReader.read_claiming``) as ``DiskStore._settle`` takes it:
    raises what the read raised; False when the load was no longer pending (nothing read). With
    ``only_into`` (a list read, whose later records went through the same bounce buffer), a
    record that landed anywhere else (the bounce buffer, for a load abandoned after its read)
    is False too: its bytes are gone, so it is not checked."""
    if isinstance(read, Exception):
        raise read
    if read is None:
        return None
    if read.into is None or (only_into is not None and read.into is not only_into):
        return False
    return read
