"""The block store interface every backend implements, and the values it returns.

A store maps opaque keys (bytes, 1..256 long) to payloads (bytes of one KV block). It is a
cache, not a database: a store may drop any record at any time to stay under its byte cap,
so callers treat every lookup as "maybe". A *miss* is an outcome (``False``), never an
exception: unknown key, evicted record, record removed by another process, or a record that
failed verification (then also quarantined, and not offered again).

Contracts shared by all backends:

* **Thread safety**: every method may be called from many threads at once.
* **Blocking**: every method except ``contains`` may block on I/O or on other processes
  (a disk store's index lock); call them from the tier's own worker threads, never from the
  scheduler's critical path. ``contains`` is an in-memory lookup, no syscall.
* **Abilities**: what a backend can do beyond this surface (ask a server about keys it has
  not seen, hold a byte cap of its own, report parts) is declared in ``abilities``; callers
  read that value and never probe for methods. The methods behind the abilities have
  defaults here, so every store answers them.
* **Faults**: I/O faults (ENOSPC, EIO, permissions, a damaged file) are logged and turned
  into ``False``; they never raise. Programming errors (a key that is not bytes, a closed
  store misused) raise ``ValueError``.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from kvtier.buffers import copy_into
from kvtier.format.checksum import Buffer

if TYPE_CHECKING:
    from kvtier.format.sealing import RecordSealer


def check_put_many(keys: Sequence[bytes], payloads: Sequence[Buffer]) -> None:
    """``put_many``'s arguments: one payload per key, else ``ValueError`` (a caller's bug)."""
    if len(keys) != len(payloads):
        raise ValueError(f"put_many: {len(keys)} keys for {len(payloads)} payloads")


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of ``BlockStore.verify``."""

    #: Machine-readable kind, e.g. "missing_file", "orphan_file", "corrupt", "counter".
    kind: str
    #: Human-readable explanation with the offending values.
    detail: str
    #: The record's key, when the problem concerns one.
    key: bytes | None = None
    #: The file concerned, relative to the store's folder, when there is one.
    path: str | None = None
    #: True when ``verify(fix=True)`` repaired it.
    fixed: bool = False


@dataclass(frozen=True, slots=True)
class StoreAbilities:
    """What a store can do beyond the ``BlockStore`` surface, declared by its class.

    Every method an ability names exists on every store (``BlockStore`` has defaults); the
    flag says whether its answer means more than the default's.
    """

    #: ``contains`` may be False for a key the store holds (another process stored it on a
    #: server this process has not asked), and ``exists_many`` asks. False: ``contains``
    #: knows every key this process can load, and ``exists_many`` adds nothing to it.
    remote_lookup: bool = False
    #: ``capacity_bytes`` is a byte cap the store keeps itself. False: capacity is someone
    #: else's (a server's ``maxmemory``) and ``capacity_bytes`` is 0.
    capacity: bool = False
    #: The store is made of other stores, listed by ``parts()`` under their metric names.
    parts: bool = False


@dataclass(slots=True)
class StoreStats:
    """Counters since the store was opened (this process only); ``stats()`` returns a copy."""

    #: Successful puts.
    puts: int = 0
    #: Puts that stored nothing (no room after eviction, I/O error).
    put_failures: int = 0
    #: Loads that filled the caller's buffer with verified data.
    hits: int = 0
    #: Loads that returned False, corrupt records included.
    misses: int = 0
    #: Records that failed verification, by reason ("checksum", "key", "not_regular"...).
    corrupt: dict[str, int] = field(default_factory=dict)
    #: Records dropped to make room.
    evictions: int = 0
    #: Record bytes (header + payload) written by successful puts.
    bytes_written: int = 0
    #: Payload bytes delivered by hits.
    bytes_read: int = 0
    #: Hits the disk store copied from the page cache, which held the whole record, instead of
    #: reading the device (kvtier.store.disk.io); 0 for other stores.
    page_cache_hits: int = 0
    #: Files moved into quarantine.
    quarantined: int = 0

    def copy(self) -> StoreStats:
        """A snapshot that later operations do not change."""
        return dataclasses.replace(self, corrupt=dict(self.corrupt))


@runtime_checkable
class LoadClaim(Protocol):
    """One load's right to write its destination (a host-pool row), which the scheduler may
    take back at the load's deadline (``kvtier.dataplane.abandonable.AbandonableLoad``).

    A store writes ``out`` in ``get_into_when`` only between a ``claim()`` that returned True
    and ``written()``; outside that window ``out`` may be another load's already. I/O threads
    call ``claim``, ``written`` and ``release``; the scheduler abandons.
    """

    def claim(self) -> bool:
        """I/O thread, data in hand: True if it may now write ``out``."""
        ...

    def written(self) -> None:
        """I/O thread: ``out`` will not be written again. Said as soon as that is so: a thread
        loading several blocks in turn must not hold a finished one where the scheduler
        cannot abandon it."""
        ...

    def release(self) -> bool:
        """I/O thread: give back a claim a failed read took, so ``out`` can be claimed again
        (by another source, or by the same store reading another way). False when the claim
        cannot be given back: then it is spent."""
        ...

    @property
    def abandoned(self) -> bool:
        """True once abandoned: whatever ``out`` holds is not this load's, and may be another
        load's already."""
        ...

    @property
    def native_cell(self) -> bytearray | None:
        """The claim's state as a 4-byte cell moved only by compare-and-swap, which a native
        reader claims on itself in the same call as its read; None where there is none."""
        ...


class FixedClaim:
    """A ``LoadClaim`` whose answer is fixed and that nothing abandons: for a caller that owns
    ``out`` outright (a benchmark, a check), or one that refuses every claim."""

    __slots__ = ("_grant",)

    #: No cell: stores claim it from Python.
    native_cell: bytearray | None = None
    abandoned = False

    def __init__(self, grant: bool = True) -> None:
        self._grant = grant

    def claim(self) -> bool:
        return self._grant

    def written(self) -> None:
        """Nothing to tell: nobody takes the row back."""

    def release(self) -> bool:
        return False


class BlockStore(abc.ABC):
    """A byte-capped, evicting map from block keys to payloads (see the module contracts)."""

    #: What this store can do beyond the abstract surface; each backend declares its own.
    abilities: StoreAbilities = StoreAbilities()
    #: The store's own byte cap (``abilities.capacity``); 0 where capacity is a server's.
    capacity_bytes: int = 0

    @abc.abstractmethod
    def put(self, key: bytes, payload: Buffer) -> bool:
        """Store ``payload`` under ``key``, replacing any record.

        ``payload`` is read in place (not copied, not kept); the caller must not change it
        until ``put`` returns.

        Returns True once the record is durable to the store's policy and visible to
        ``contains``/``get_into``; False when it was not stored (larger than the cap, no room
        after eviction, an I/O fault). May evict other records first.
        """

    def put_many(self, keys: Sequence[bytes], payloads: Sequence[Buffer]) -> list[bool]:
        """``put`` of each key with its payload, in order; per key, whether it was stored. A
        record that fails is a failed put; the others are still stored. A store overrides it
        only to store the list at less cost (a disk store: one index transaction pair per
        batch instead of one per record).
        """
        check_put_many(keys, payloads)
        return [self.put(key, payload) for key, payload in zip(keys, payloads, strict=True)]

    @abc.abstractmethod
    def get_into(self, key: bytes, out: memoryview) -> bool:
        """Fill ``out`` with the payload of ``key`` and verify it; True on a verified hit.

        ``out`` must be writable and exactly the stored payload's length (else False). On
        False the content of ``out`` is unspecified: it may hold part of a record. A record
        that fails verification is quarantined, so later lookups miss without I/O.
        """

    @abc.abstractmethod
    def contains(self, key: bytes) -> bool:
        """True if this process believes ``key`` is stored; in memory, no syscall.

        A True may still end in a miss (another process evicted the record); a False may
        hide a record another process added since the last ``refresh``.
        """

    @abc.abstractmethod
    def delete(self, key: bytes) -> bool:
        """Remove ``key``; True if a record was removed."""

    @abc.abstractmethod
    def keys(self) -> Iterator[bytes]:
        """Keys this process believes are stored (a snapshot; order unspecified)."""

    @abc.abstractmethod
    def payload_len(self, key: bytes) -> int | None:
        """Payload length of ``key``'s record, or None if not stored; in memory."""

    @abc.abstractmethod
    def used_bytes(self) -> int:
        """Bytes of records held under the cap (all processes sharing the store)."""

    @abc.abstractmethod
    def stats(self) -> StoreStats:
        """A snapshot of this process's counters."""

    @abc.abstractmethod
    def verify(self, fix: bool = False) -> list[Problem]:
        """Check the store against ground truth; with ``fix``, repair what can be repaired.

        Slow (reads every record): meant for the CLI and the end of stress tests.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release files and locks; idempotent. Later calls return False or empty results."""

    def refresh(self) -> int:
        """Pick up records other processes added or removed; returns how many changed.

        The default has nothing to pick up: a store private to one process.
        """
        return 0

    def exists_many(self, keys: Iterable[bytes]) -> set[bytes]:
        """Which of ``keys`` the store holds; may block on a server (``remote_lookup``).

        The default is ``contains`` per key: right for a store that knows every key it holds.
        """
        return {key for key in keys if self.contains(key)}

    def get_into_when(
        self, key: bytes, out: memoryview, claim: LoadClaim, bounce: memoryview
    ) -> bool:
        """``get_into`` that writes ``out`` only after ``claim.claim()`` returned True.

        The record is read and verified in ``bounce`` (the caller's buffer of ``out``'s size,
        private to its thread), then copied into ``out`` once claimed: a caller that gave up
        on the load (``claim`` False) never finds ``out`` changed, however late the read
        returns. Stores override it only to do the same with fewer copies.
        """
        if not self.get_into(key, bounce):
            return False
        if not claim.claim():
            return False
        copy_into(out, bounce)
        claim.written()
        return True

    def get_many_into_when(
        self,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        claims: Sequence[LoadClaim],
        bounce: memoryview,
    ) -> list[bool]:
        """``get_into_when`` of each key into its ``out`` under its claim, in turn, through
        one ``bounce`` buffer (of every ``out``'s size); per key, whether it was loaded. A
        store overrides it only to read the list in fewer calls."""
        return [
            self.get_into_when(key, out, claim, bounce)
            for key, out, claim in zip(keys, outs, claims, strict=True)
        ]

    def parts(self) -> list[tuple[str, BlockStore]]:
        """The stores this one is made of, under their metric names (``abilities.parts``);
        empty for a store of one part."""
        return []

    def without_server(self) -> BlockStore | None:
        """This store without its parts on a server: what a writer can still keep when the
        server falls behind (a disk store behind which a shared store sits keeps its disk).
        The store itself when no part is on a server; None when all of it is."""
        return self

    def tenant_view(self, sealer: RecordSealer) -> BlockStore:
        """This store's records as the tenant of ``sealer`` names and opens them, over the
        same records, cap and eviction (kvtier.store.tenant_view). Only a store of sealed
        records has one: the default raises ``ValueError``."""
        raise ValueError(f"{type(self).__name__} does not seal records: no tenant view")

    def get(self, key: bytes) -> bytes | None:
        """The payload of ``key`` as new bytes, or None on a miss (built on ``get_into``)."""
        out = bytearray(self.payload_len(key) or 0)  # unknown: get_into misses (and counts it)
        return bytes(out) if self.get_into(key, memoryview(out)) else None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
