"""``verify``: compare a disk store's index with its files, read every record, repair on demand.

Problem kinds (``Problem.kind``) and what ``fix=True`` does about them:

==============  ==============================================  ==============================
kind            meaning                                         fix
==============  ==============================================  ==============================
missing_file    a ready row whose file is gone                  drop the row
corrupt         a ready row whose file fails a check (detail    quarantine the file, drop the
                names the reason: checksum, length, key...)     row
stale_pending   an unfinished write of a dead process           drop the row and its files
stale_trash     an evicted file a dead process did not unlink   unlink it
stale_temp      a temp file of a dead process (also a small     unlink it
                file's replacement older than a minute)
orphan_file     a record file no row names                      unlink it
unknown_file    a file or folder the store did not make         quarantine it
counter         the usage total differs from the charges' sum   set the total
namespace_file  namespace.json missing or not this namespace    rewrite it
decision_file   decision.json (the engines' decision evidence)  remove it (the engines ignore
                not a regular file, too large or not JSON       it, and write a new one)
quarantine      a quarantine entry charged but gone, or kept    drop the charge / remove the
                but not charged                                 file
==============  ==============================================  ==============================

Files are listed before rows are read: a record is renamed into place only after its
pending row exists, so a file that a concurrent writer publishes during the scan is never
mistaken for an orphan. Other processes keep writing and evicting during a check, so before a
file or a row is reported missing or unnamed it is looked at again: a record published after
the listing, a file evicted (unlinked, then un-trashed) after it, or a row evicted after the
rows were read is work in flight, not a problem; so is a dead session's trash entry that a
store reclaimed meanwhile.

The decision file is the engines', not the store's: the check only makes sure it is a small
JSON object an engine can read (its meaning is the engine's to judge; a file it cannot use is
ignored there, never served).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvtier.errors import ConfigError, CorruptRecordError
from kvtier.format.namespace import Namespace
from kvtier.format.record import (
    RecordHeader,
    decode_header,
    verify_payload,
    verify_stored_bytes,
)
from kvtier.format.sealing import RecordSealer
from kvtier.store.base import Problem
from kvtier.store.disk import layout
from kvtier.store.disk.index import PENDING, Index, Row, Trashed
from kvtier.store.disk.quarantine import REASON_SUFFIX, Limits, quarantine
from kvtier.store.disk.reader import RecordReader
from kvtier.store.disk.session import is_alive_under


@dataclass
class StoreCheck:
    """One run of the checks over a namespace folder; ``run()`` returns the problems."""

    #: The root.
    root: Path
    #: The namespace the folder is for.
    namespace: Namespace
    #: The root's open index, bound to the namespace.
    index: Index
    #: File I/O used to read records (the store's own).
    reader: RecordReader
    #: The checking store's own session (alive by definition).
    session_id: str
    #: Quarantine size limits, as the store's.
    quarantine_limits: Limits
    #: Repair what can be repaired.
    fix: bool
    #: Called with the bytes of each record read (a progress bar).
    progress: Callable[[int], None] | None = None
    #: Opens sealed records (the store's); None: a sealed record's ciphertext checksum is
    #: checked and ``unopened`` called with its key id.
    sealer: RecordSealer | None = None
    #: Called with the key id of each sealed record that could not be authenticated (no key).
    unopened: Callable[[bytes], None] | None = None
    #: Called with the name of each sealed record whose checksums hold but whose tag fails
    #: under ``sealer``'s tenant (another tenant's, or forged: the two cannot be told apart
    #: without the other tenant's keys); None: such a record is an ``unauthenticated``
    #: problem. Either way it is never repaired: it may be another tenant's good record.
    unauthenticated: Callable[[bytes], None] | None = None
    problems: list[Problem] = field(default_factory=list)
    _alive: dict[str, bool] = field(default_factory=dict)

    @property
    def dir(self) -> Path:
        """The namespace folder."""
        return self.root / self.namespace.digest_hex()

    @property
    def ns(self) -> str:
        return self.namespace.digest_hex()

    def report(
        self,
        kind: str,
        detail: str,
        repair: Callable[[], object] | None,
        key: bytes | None = None,
        path: str | None = None,
    ) -> None:
        fixed = False
        if self.fix and repair is not None:
            repair()
            fixed = True
        self.problems.append(Problem(kind, detail, key, path, fixed))

    def alive(self, session: str) -> bool:
        if session not in self._alive:
            self._alive[session] = session == self.session_id or is_alive_under(self.root, session)
        return self._alive[session]

    def run(self) -> list[Problem]:
        files = self.scan_blocks()
        temps = sorted(os.listdir(self.dir / layout.TMP))
        rows = self.index.all_rows()
        prefix = f"{self.ns}/"
        trash = [(e, s) for e, s in self.index.trash() if e.path.startswith(prefix)]
        named = {row.name for row in rows} | {e.path[len(prefix) :] for e, _ in trash}
        for row in rows:
            if row.state == PENDING:
                self.check_pending(row)
            else:
                self.check_ready(row, files.get(row.name))
        for entry, session in trash:
            if not self.alive(session) and self.still_dead_trash(entry):
                self.report(
                    "stale_trash",
                    f"evicted file left by dead session {session}",
                    lambda e=entry: self.remove_trash(e),
                    path=entry.path[len(prefix) :],
                )
        for relative, mode in sorted(files.items()):
            if relative not in named:
                self.check_unnamed(relative, mode)
        for name in temps:
            self.check_temp(name)
        self.check_quarantine()
        self.check_counter()
        self.check_namespace_file()
        self.check_decision_file()
        self.check_small_file_temps()
        return self.problems

    def scan_blocks(self) -> dict[str, int]:
        """relative path -> lstat mode of everything two levels under blocks/."""
        found: dict[str, int] = {}
        for top in os.scandir(self.dir / layout.BLOCKS):
            relative = f"{layout.BLOCKS}/{top.name}"
            with contextlib.suppress(FileNotFoundError):  # evicted while we looked
                if not top.is_dir(follow_symlinks=False):
                    found[relative] = top.stat(follow_symlinks=False).st_mode
                    continue
                for entry in os.scandir(top.path):
                    with contextlib.suppress(FileNotFoundError):
                        mode = entry.stat(follow_symlinks=False).st_mode
                        found[f"{relative}/{entry.name}"] = mode
        return found

    def still_ready(self, row: Row) -> bool:
        """True if ``row`` is still a ready record (not evicted or replaced since it was read)."""
        return self.index.is_ready(row.record_id)

    def still_dead_trash(self, entry: Trashed) -> bool:
        """True if ``entry`` is still in trash under a dead session (looked at again: any
        store's refresh adopts a dead session's trash and empties it)."""
        owner = next((s for e, s in self.index.trash() if e.path == entry.path), None)
        return owner is not None and not self.alive(owner)

    def check_ready(self, row: Row, mode: int | None) -> None:
        if mode is None and not os.path.lexists(self.dir / row.name) and self.still_ready(row):
            self.report(
                "missing_file",
                f"record {row.record_id} has no file",
                lambda: self.index.remove_records([row.record_id]),
                row.key,
                row.name,
            )
            return
        reason, detail = self.read_record(row)
        if reason == "gone":
            if not self.still_ready(row):
                return  # evicted while we read it
            reason, detail = "io_error", f"{row.name} vanished while its row stayed ready"
        if reason is not None:
            self.report(
                "corrupt",
                f"{reason}: {detail}",
                lambda: self.quarantine_row(row, reason, detail),
                row.key,
                row.name,
            )

    def read_record(self, row: Row) -> tuple[str | None, str]:
        if self.progress is not None:
            self.progress(row.record_bytes)
        out = memoryview(bytearray(row.payload_len))
        try:
            header = decode_header(
                self.reader.read_into(self.dir / row.name, out),
                self.namespace.digest(),
                row.key,
                row.payload_len,
            )
            if self.sealer is not None:
                self._authenticate(row, header, out)
            elif header.seal is not None:
                verify_stored_bytes(header, out)
                if self.unopened is not None:
                    self.unopened(header.seal.key_id)
            else:
                verify_payload(header, out)
        except CorruptRecordError as exc:
            return exc.reason, str(exc)
        except FileNotFoundError as exc:
            return "gone", str(exc)
        except OSError as exc:
            return "io_error", str(exc)
        return None, ""

    def _authenticate(self, row: Row, header: RecordHeader, out: memoryview) -> None:
        """Open the record with the sealer; a failed tag is ``unauthenticated``'s (above)."""
        assert self.sealer is not None
        try:
            self.sealer.verify(header, out)
        except CorruptRecordError as exc:
            if exc.reason != "auth":
                raise
            if self.unauthenticated is not None:
                self.unauthenticated(row.key)
            else:
                self.report("unauthenticated", str(exc), None, row.key, row.name)

    def quarantine_row(self, row: Row, reason: str, detail: str) -> None:
        label = f"{row.key.hex()}.{row.record_id}"
        moved = quarantine(
            self.root,
            self.index,
            row.path,
            label,
            reason,
            detail,
            self.quarantine_limits,
            row.record_id,
        )
        if moved is None:
            stuck = os.path.lexists(self.root / row.path)  # kept named, in trash
            self.index.remove_records([row.record_id], trash=stuck)

    def check_pending(self, row: Row) -> None:
        if self.alive(row.session):
            return

        def repair() -> None:
            _, entries = self.index.reclaim([row.session])
            for entry in entries:
                self.remove_trash(entry)

        self.report(
            "stale_pending",
            f"unfinished write of dead session {row.session}",
            repair,
            row.key,
            row.name,
        )

    def remove_trash(self, entry: Trashed) -> None:
        if entry.temp:
            _remove(self.root / entry.temp)
        _remove(self.root / entry.path)
        self.index.trash_done([entry.path])

    def check_unnamed(self, relative: str, mode: int) -> None:
        if not os.path.lexists(self.dir / relative):
            return  # evicted, or its failed write undone, after the listing
        parsed = layout.parse_record_name(relative)
        if parsed is None or not stat.S_ISREG(mode):
            self.report(
                "unknown_file",
                f"not made by the store (mode {mode:#o})",
                lambda: quarantine(
                    self.root,
                    self.index,
                    f"{self.ns}/{relative}",
                    "unknown",
                    "unknown_file",
                    "found by verify",
                    self.quarantine_limits,
                ),
                path=relative,
            )
        else:
            self.report(
                "orphan_file",
                "record file that no index row names",
                lambda: _remove(self.dir / relative),
                parsed[0],
                relative,
            )

    def check_temp(self, name: str) -> None:
        session = layout.temp_session(name)
        if session is not None and self.alive(session):
            return
        relative = f"{layout.TMP}/{name}"
        self.report(
            "stale_temp",
            "temp file of a dead session",
            lambda: _remove(self.dir / relative),
            path=relative,
        )

    def check_quarantine(self) -> None:
        """Quarantine entries and the index's charges for them agree (a missing ``.reason``
        file is fine: it may not be written yet)."""
        folder = self.dir / layout.QUARANTINE
        prefix = f"{self.ns}/{layout.QUARANTINE}/"
        charged = {p[len(prefix) :] for p, _, _ in self.index.quarantined() if p.startswith(prefix)}
        kept = set(os.listdir(folder))
        for name in sorted(charged - kept):
            still = any(p == prefix + name for p, _, _ in self.index.quarantined())
            if still and not os.path.lexists(folder / name):  # not pruned meanwhile
                self.report(
                    "quarantine",
                    "charged quarantine entry is gone",
                    lambda n=name: self.drop_quarantine_charge(prefix + n),
                    path=f"{layout.QUARANTINE}/{name}",
                )
        for name in sorted(kept - charged):
            stem = name.removesuffix(REASON_SUFFIX)
            if stem in charged or (stem != name and stem in kept):
                continue  # a reason file, or one whose entry is being quarantined now
            if not self.still_uncharged(prefix + name):
                continue
            self.report(
                "quarantine",
                "quarantined file the index does not charge",
                lambda n=name: _remove_any(folder / n),
                path=f"{layout.QUARANTINE}/{name}",
            )

    def drop_quarantine_charge(self, path: str) -> None:
        _remove(self.root / f"{path}{REASON_SUFFIX}")  # files first, then their charge
        self.index.quarantine_done([path])

    def still_uncharged(self, path: str) -> bool:
        """True if ``path`` (relative to the root) exists and no quarantine entry charges it
        (looked at again: a concurrent quarantine renames first and charges right after)."""
        if not os.path.lexists(self.root / path):
            return False
        return all(p != path for p, _, _ in self.index.quarantined())

    def check_counter(self) -> None:
        used, actual = self.index.counter_drift()
        if used != actual:
            self.report(
                "counter",
                f"used_bytes says {used}, charges add up to {actual}",
                lambda: self.index.set_used_bytes(actual),
            )

    def check_namespace_file(self) -> None:
        path = self.dir / layout.NAMESPACE_FILE
        try:
            ok = Namespace.from_json(path.read_text()) == self.namespace
        except (OSError, ConfigError):
            ok = False
        if not ok:
            self.report(
                "namespace_file",
                f"{path.name} missing or for another namespace",
                lambda: layout.write_small_file(path, self.namespace.to_json().encode()),
                path=layout.NAMESPACE_FILE,
            )

    def check_decision_file(self) -> None:
        path = self.dir / layout.DECISION_FILE
        try:
            data = layout.read_small_file(path, layout.DECISION_FILE_MAX_BYTES)
            if data is None:
                return
            readable = isinstance(json.loads(data), dict)
            why = "not a JSON object"
        except OSError as exc:
            readable, why = False, exc.strerror or str(exc)
        except ValueError:
            readable, why = False, "not JSON"
        if not readable:
            self.report(
                "decision_file",
                f"{path.name} unusable ({why}); engines ignore it",
                lambda: _remove_any(path),
                path=layout.DECISION_FILE,
            )

    def check_small_file_temps(self) -> None:
        """Replacements of namespace.json or decision.json a writer never renamed (it was
        killed): a write takes milliseconds, so one older than a minute is left over."""
        for entry in os.scandir(self.dir):
            if layout.small_file_temp_of(entry.name) is None:
                continue
            with contextlib.suppress(FileNotFoundError):
                if time.time() - entry.stat(follow_symlinks=False).st_mtime < _SMALL_TEMP_AGE_S:
                    continue
                self.report(
                    "stale_temp",
                    "small file's replacement left by a writer that did not finish",
                    lambda p=Path(entry.path): _remove(p),
                    path=entry.name,
                )


#: Age after which a small file's temp file is a leftover (its write takes milliseconds).
_SMALL_TEMP_AGE_S = 60.0


def _remove_any(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _remove(path: Path) -> None:
    with contextlib.suppress(IsADirectoryError):
        path.unlink(missing_ok=True)
