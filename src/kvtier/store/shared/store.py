"""``SharedStore``: a block store on a Redis/Valkey server or Cluster, shared by replicas.

Layout on the server. One string value per block, under the key
``kvt:<namespace digest hex>:<block key hex>``. The value is exactly a disk-tier record
(kvtier.format.record: the 4 KiB header with namespace digest, key, payload length and
checksum, then the payload), so every load is verified: magic, version, header checksum,
namespace, key, length and payload checksum. Engines of the same namespace (same model,
weights, KV layout, hash) share values; other namespaces never see them, neither by key nor,
should a value be copied under a foreign key, by header.

No hash tags: a tag would put a whole namespace in one slot, on one master. Without one the
keys spread over every master, and our pipelines (``exists_many``) are split per node by
redis-py, which is fine because every operation touches one key and needs no atomicity.
Block keys are hex-encoded so a ``{`` byte inside a binary key can never form a tag.

Eviction is the server's (``maxmemory`` + ``allkeys-lru``); the store keeps no byte cap of
its own. What it does cap is the size of one record: ``max_record_bytes``, by default 1/8 of
the smallest master's maxmemory and half of ``proto-max-bulk-len`` (a single value larger than
maxmemory would evict the whole cache, itself included).

In-memory view. ``contains``/``payload_len``/``keys``/``used_bytes`` answer from a bounded LRU
map of keys this process stored or found (no network I/O, as BlockStore requires). Another
replica's puts are learnt through ``exists_many`` (one pipelined STRLEN per key, called by the
tier on its own threads) or by a hit; a miss, a delete or a failed verification drops a key.

Faults. Every operation has a connect and a reply timeout and at most ``retries`` fast
retries. A connection error or timeout opens the server's circuit breaker (one per Cluster
node): while open, operations on its keys return False at once, without I/O; after the
back-off one operation probes, and a success closes it. Nothing raises to the caller while
serving: errors are counted and logged (once per breaker opening) and become misses/False.
Corrupt values are deleted on the server (a plain DEL: a replica's good record written in the
instant between our GET and DEL is lost too, which costs a miss, never wrong bytes).

Sealed values (a ``RecordSealer``, kvtier.format.sealing): the server key holds the block's
name, a keyed MAC of the block key, in place of the key's hex, and the value is a sealed
record, so neither a SCAN nor a read of the server's memory or its RDB/AOF files yields a block
hash or KV. The in-memory view is keyed by name too; each method turns the caller's block key
into the names it may be stored under (the write key's, then each older key's). A GET asks for
the first name the view knows, else the write key's: a record another replica wrote under an
older key is found through ``exists_many``, which asks for every name. ``tenant_view`` gives
another tenant's view of the same prefix and in-memory view (kvtier.store.tenant_view).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

import redis
from redis.cluster import RedisCluster
from redis.connection import ConnectionPool
from redis.exceptions import (
    AuthenticationError,
    AuthorizationError,
    ClusterDownError,
    NoPermissionError,
    OutOfMemoryError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from kvtier.buffers import copy_into
from kvtier.errors import CorruptRecordError
from kvtier.format.checksum import Buffer
from kvtier.format.namespace import Namespace
from kvtier.format.record import (
    HEADER_BYTES,
    check_key,
    decode_header,
    encode_header,
    make_header,
    verify_payload,
    verify_stored_bytes,
)
from kvtier.format.sealing import RecordSealer, sealed_namespace
from kvtier.settings import SharedTierSettings
from kvtier.store.base import BlockStore, LoadClaim, Problem, StoreAbilities
from kvtier.store.shared import batch, readinto, startup
from kvtier.store.shared.breaker import CircuitBreaker
from kvtier.store.shared.client import READ_INTO_AVAILABLE, RecordValue, retry_pause_s
from kvtier.store.shared.stats import SharedStoreStats
from kvtier.store.shared.view import KeyView
from kvtier.store.tenant_view import SealedStore

log = logging.getLogger("kvtier.store.shared")

#: First bytes of every server key kvtier writes (an ACL user can be limited to ``~kvt:*``).
KEY_PREFIX = b"kvt:"
# Errors that mean "the server did not answer": they open the breaker.
_UNREACHABLE = (
    RedisConnectionError,
    RedisTimeoutError,
    ClusterDownError,
    SlotNotCoveredError,
    RedisClusterException,
    OSError,
)
# Faults an operation retries (``retries`` times), as redis-py's ``Retry`` does for a GET.
_RETRIED = (RedisConnectionError, RedisTimeoutError, TimeoutError)
_EXISTS_BATCH = 1024
#: Keys ``refresh`` re-checks per call (one pipelined round trip per node).
REFRESH_BATCH = 1024
_T = TypeVar("_T")


class _Unavailable(Exception):
    """Internal: the operation did not reach the server (breaker open or fault)."""


class SharedStore(SealedStore):
    """A ``BlockStore`` on Redis/Valkey, standalone or Cluster (see the module docstring).

    Thread-safe; every method but ``contains``/``payload_len``/``keys``/``used_bytes``
    does network I/O, bounded by the configured timeouts: call them from the tier's threads.
    """

    #: Other replicas' keys are found by asking the server (``exists_many``); capacity is the
    #: server's ``maxmemory``, not a cap of the store's.
    abilities = StoreAbilities(remote_lookup=True)

    def __init__(
        self,
        settings: SharedTierSettings,
        namespace: Namespace,
        *,
        clock: Callable[[], float] | None = None,
        sealer: RecordSealer | None = None,
    ) -> None:
        """Connect, read the server's memory settings and fail closed on a bad configuration.

        ``settings`` were validated when they were built (``SharedTierSettings.parse``).
        Raises ``ConfigError`` when the server cannot be reached (naming ``url``),
        authentication fails (naming ``username``/``password``), TLS fails (naming the
        ``tls_*`` options) or one record of ``namespace`` would exceed the record cap.
        ``clock`` (monotonic seconds) is a seam for tests of the breaker. ``sealer``: encrypt
        values and name them by keyed MACs (module docstring); None: plain records.
        """
        if not isinstance(settings, SharedTierSettings):
            raise TypeError(
                f"SharedStore takes SharedTierSettings, not {type(settings).__name__}; "
                "build them with SharedTierSettings.parse({'url': ...})"
            )
        #: The validated settings (``url`` holds no credentials; ``password`` is a SecretStr).
        self.config = settings
        if sealer is not None:
            namespace = sealed_namespace(namespace)
        self.namespace = namespace
        self._digest = namespace.digest()
        self._prefix = KEY_PREFIX + namespace.digest_hex().encode() + b":"
        self._server = self.config.server
        self._clock = clock
        self._sealer = sealer
        #: name -> (block key, its tenant's sealer) of sealed records this process stored or
        #: loaded (``keys()``).
        self._known: dict[bytes, tuple[bytes, RecordSealer]] = {}
        self._lock = threading.Lock()
        self._view = KeyView(self.config.view_max_keys)
        self._stats = SharedStoreStats()
        self._breakers: dict[str, CircuitBreaker] = {}
        self._closed = False
        self._client: redis.Redis | RedisCluster = startup.connect(self.config)
        startup.warn_if_untested(self._client, self.config)
        found = startup.server_settings(self._client, self.config)
        #: Largest record (header + payload) ``put`` sends; bigger puts return False.
        self.max_record_bytes = startup.record_cap(found, self.config, namespace.block_bytes)
        log.info(
            "shared tier: %s (connect %gs, reply %gs, %d retries, auth %s), namespace %s, "
            "records <= %d bytes",
            self._server.redacted,
            settings.connect_timeout_s,
            settings.op_timeout_s,
            settings.retries,
            "yes" if settings.password is not None else "no",
            namespace.digest_hex(),
            self.max_record_bytes,
        )
        if not READ_INTO_AVAILABLE:
            log.info(
                "shared tier: hiredis is not installed; loads go through redis-py's parser "
                "(a new bytes object and one more copy per load)"
            )

    @classmethod
    def from_options(cls, options: Mapping[str, Any], namespace: Namespace) -> SharedStore:
        """A store from a plain mapping of ``SharedTierSettings`` options (a bad or unknown
        one raises ``ConfigError`` naming it)."""
        return cls(SharedTierSettings.parse(options), namespace)

    # ------------------------------------------------------------------ plumbing

    def _scrubbed(self, text: str) -> str:
        return startup.scrub(text, self.config)

    def _server_key(self, key: bytes) -> bytes:
        return self._prefix + key.hex().encode()

    def _names(self, sealer: RecordSealer | None, key: bytes) -> list[bytes]:
        """The names ``key`` may be stored under by ``sealer``'s tenant (itself, for plain
        records)."""
        check_key(key)
        return [key] if sealer is None else sealer.names(self._digest, key)

    def _find(self, sealer: RecordSealer | None, key: bytes) -> bytes:
        """The name to ask for: the first one the view knows, else the write key's."""
        names = self._names(sealer, key)
        return next((n for n in names if n in self._view), names[0])

    def _remember(self, name: bytes, block_key: bytes, sealer: RecordSealer | None) -> None:
        if sealer is None:
            return
        with self._lock:
            self._known.pop(name, None)
            self._known[name] = (block_key, sealer)
            if len(self._known) > self.config.view_max_keys:
                del self._known[next(iter(self._known))]

    def _node_of(self, server_key: bytes) -> str:
        if isinstance(self._client, RedisCluster):
            return str(self._client.get_node_from_key(server_key).name)
        host, port = self._server.hosts[0]
        return f"{host}:{port}"

    def _breaker(self, node: str) -> CircuitBreaker:
        with self._lock:
            breaker = self._breakers.get(node)
            if breaker is None:
                breaker = CircuitBreaker(
                    self.config.breaker_base_s,
                    self.config.breaker_max_s,
                    *([self._clock] if self._clock else []),
                )
                self._breakers[node] = breaker
            return breaker

    def _count_error(self, kind: str) -> None:
        with self._lock:
            self._stats.errors[kind] = self._stats.errors.get(kind, 0) + 1

    def _call(self, server_key: bytes, op: Callable[[], _T]) -> _T:
        """Run ``op`` against the node of ``server_key`` through its breaker.

        Raises ``_Unavailable`` (internal) when the op was skipped or failed; never anything
        else. Error replies (OOM, permissions) close the breaker: the server is alive.
        """
        try:
            node = self._node_of(server_key)
        except Exception:
            node = "cluster"  # slot map being rebuilt: one breaker for the unknown node
        breaker = self._breaker(node)
        if not breaker.allow():
            with self._lock:
                self._stats.breaker_skips += 1
            raise _Unavailable
        try:
            result = op()
        except Exception as exc:
            self._failed(node, breaker, exc)
        breaker.success()
        return result

    def _failed(self, node: str, breaker: CircuitBreaker, exc: Exception) -> NoReturn:
        """Count and log what an operation on ``node`` ran into, tell its breaker whether the
        server answered, and raise ``_Unavailable``."""
        if isinstance(exc, OutOfMemoryError):
            breaker.success()
            self._count_error("oom")
        elif isinstance(exc, (NoPermissionError, AuthenticationError, AuthorizationError)):
            breaker.success()
            self._count_error("permission")
            log.warning("shared tier: %s refused an operation: %s", node, self._scrubbed(str(exc)))
        elif isinstance(exc, _UNREACHABLE):
            was_open = breaker.is_open
            breaker.failure()
            kind = "timeout" if isinstance(exc, (RedisTimeoutError, TimeoutError)) else "connection"
            self._count_error(kind)
            if not was_open:
                log.warning(
                    "shared tier: server %s unreachable (%s: %s); misses for %.1f s or more",
                    node,
                    type(exc).__name__,
                    self._scrubbed(str(exc))[:200],
                    self.config.breaker_base_s,
                )
        elif isinstance(exc, ResponseError):
            breaker.success()
            self._count_error("response")
            log.warning(
                "shared tier: %s replied with an error: %s", node, self._scrubbed(str(exc))[:200]
            )
        else:  # a client bug must not reach the engine either
            breaker.failure()
            self._count_error("unexpected")
            log.warning(
                "shared tier: unexpected %s from %s: %s",
                type(exc).__name__,
                node,
                self._scrubbed(str(exc))[:200],
            )
        raise _Unavailable from None

    def _miss(self) -> bool:
        with self._lock:
            self._stats.misses += 1
        return False

    def _drop_corrupt(self, key: bytes, server_key: bytes, exc: CorruptRecordError) -> None:
        self._view.forget(key)
        with self._lock:
            self._stats.corrupt[exc.reason] = self._stats.corrupt.get(exc.reason, 0) + 1
        log.warning(
            "shared tier: value of key %s failed verification (%s); deleting it",
            key.hex()[:16],
            exc,
        )
        try:
            if self._call(server_key, lambda: self._client.delete(server_key)):
                with self._lock:
                    self._stats.corrupt_deleted += 1
        except _Unavailable:
            pass

    # ------------------------------------------------------------------ BlockStore

    def _put(self, sealer: RecordSealer | None, key: bytes, payload: Buffer) -> bool:
        """SET the record (header + payload, sent without joining them); False on any fault."""
        check_key(key)
        view = memoryview(payload).cast("B")
        if self._closed:
            return self._put_failed(None)
        record_bytes = HEADER_BYTES + view.nbytes
        if record_bytes > self.max_record_bytes:
            return self._put_failed("too_large")
        if sealer is None:
            header = encode_header(make_header(self._digest, key, view))
        else:
            block_key, key = key, sealer.name(self._digest, key)
            sealed, view = sealer.seal(self._digest, key, view)
            header = encode_header(sealed)
            self._remember(key, block_key, sealer)
        server_key = self._server_key(key)
        value = RecordValue((header, view))
        try:
            self._call(server_key, lambda: self._client.set(server_key, value))  # type: ignore[arg-type]
        except _Unavailable:
            return self._put_failed(None)
        self._view.remember(key, view.nbytes)
        with self._lock:
            self._stats.puts += 1
            self._stats.bytes_written += record_bytes
        return True

    def _put_failed(self, kind: str | None) -> bool:
        if kind:
            self._count_error(kind)
        with self._lock:
            self._stats.put_failures += 1
        return False

    def _get_into(self, sealer: RecordSealer | None, key: bytes, out: memoryview) -> bool:
        """GET the value straight into ``out`` (its header aside), verify it there.

        A wrong-sized ``out`` is a plain miss (the record stays); a value failing any check is
        deleted on the server, counted in ``corrupt`` by reason, and missed. On a miss ``out``
        may hold part of a value (the ``BlockStore`` contract).
        """
        return self._get(sealer, key, memoryview(out).cast("B"), None, None)

    def get_into_when(
        self, key: bytes, out: memoryview, claim: LoadClaim, bounce: object = None
    ) -> bool:
        return self._get_into_when(self._sealer, key, out, claim, bounce)

    def _get_into_when(
        self,
        sealer: RecordSealer | None,
        key: bytes,
        out: memoryview,
        claim: LoadClaim,
        bounce: object = None,
    ) -> bool:
        """``get_into`` that writes ``out`` only after ``claim.claim()`` returned True.

        The wait for the server happens before anything is written: a caller that gave up on
        this load (``claim`` returns False) never finds its buffer changed. The value is read
        into ``bounce`` (a writable buffer of the caller's thread, at least ``out``'s size),
        verified there and copied into ``out`` once claimed; without a usable ``bounce`` the
        client returns a new ``bytes``, verified and copied from there.
        """
        return self._get(sealer, key, memoryview(out).cast("B"), claim, bounce)

    def _get(
        self,
        sealer: RecordSealer | None,
        key: bytes,
        dest: memoryview,
        claim: LoadClaim | None,
        bounce: object,
    ) -> bool:
        block_key, key = key, self._find(sealer, key)
        known = self._view.payload_len(key)
        if self._closed or (known is not None and known != dest.nbytes):
            return self._miss()
        server_key = self._server_key(key)
        landing = _landing(dest, claim, bounce)
        # Read into ``landing`` when there is one. The client hands back the ReadInto when it
        # filled it, or what a plain GET returns (None, or a new bytes of another length, or
        # of any length where the raw read did not apply), so both paths end in one check.
        request = readinto.ReadInto(HEADER_BYTES, landing) if landing is not None else None
        if request is None:
            op: Callable[[], Any] = lambda: self._client.get(server_key)  # noqa: E731
        else:
            options = {readinto.OPTION: request}
            op = lambda: self._client.execute_command("GET", server_key, **options)  # noqa: E731
        try:
            value = self._call(server_key, op)
        except _Unavailable:
            return self._miss()
        if value is None:
            self._view.forget(key)
            return self._miss()
        direct = request is not None and value is request
        try:
            if direct:
                raw_len, header_view = HEADER_BYTES + dest.nbytes, request.head
                payload = request.payload
            else:
                raw = memoryview(value)
                raw_len, header_view, payload = raw.nbytes, raw, raw[HEADER_BYTES:]
            header = decode_header(header_view, self._digest, key)
            if header.payload_len != raw_len - HEADER_BYTES:
                raise CorruptRecordError(
                    "length",
                    f"value holds {raw_len - HEADER_BYTES} payload bytes, "
                    f"header says {header.payload_len}",
                )
            if header.payload_len != dest.nbytes:
                self._view.remember(key, header.payload_len)
                return self._miss()
            # A sealed value is opened where it landed (in place, before any claim) when that
            # buffer is writable; the client's own bytes are opened straight into ``dest``,
            # which may happen only once claimed.
            deferred = sealer is not None and payload.readonly
            if sealer is None:
                verify_payload(header, payload)
            elif not deferred:
                sealer.open(header, payload, payload)
        except CorruptRecordError as exc:
            self._drop_corrupt(key, server_key, exc)
            return self._miss()
        self._view.remember(key, header.payload_len)
        if claim is not None and not claim.claim():
            return False
        if deferred:
            try:
                sealer.open(header, payload, dest)  # type: ignore[union-attr]
            except CorruptRecordError as exc:
                self._drop_corrupt(key, server_key, exc)
                return self._miss()
        elif payload is not dest:
            copy_into(dest, memoryview(payload).cast("B"))
        if claim is not None:
            claim.written()
        self._remember(key, block_key, sealer)
        self._count_hit(header.payload_len, direct)
        return True

    def _get_many_into_when(
        self,
        sealer: RecordSealer | None,
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        claims: Sequence[LoadClaim],
        bounce: memoryview,
    ) -> list[bool]:
        """``get_into_when`` of each key; a thread's share exchanged with each server in one
        GIL-free native call (``batch``: sent, received, hashed, claimed and copied), where
        every claim carries a claim cell and records are plain. Keys whose reply is not the
        expected value (another length, an error such as MOVED) get a GET of their own, as do
        all keys where no exchange can run (sealed records, TLS, no native module)."""
        outs = [memoryview(out).cast("B") for out in outs]
        cells = [claim.native_cell for claim in claims]
        if (
            len(keys) < 2
            or sealer is not None  # opened in the bounce buffer before its claim
            or self._server.tls  # its socket decrypts in Python
            or self._closed
            or not batch.available()
            or any(cell is None for cell in cells)
            or any(out.readonly or out.nbytes > bounce.nbytes for out in outs)
        ):
            return super()._get_many_into_when(sealer, keys, outs, claims, bounce)
        answers = [False] * len(keys)
        alone: list[int] = []  # keys left to a GET of their own
        groups: dict[str, tuple[ConnectionPool, list[int]]] = {}
        for i, key in enumerate(keys):
            check_key(key)
            known = self._view.payload_len(key)
            if known is not None and known != outs[i].nbytes:
                self._miss()
                continue
            try:
                node, pool = self._pool_of(self._server_key(key))
            except Exception:  # slot map being rebuilt: the GET finds the node
                alone.append(i)
                continue
            groups.setdefault(node, (pool, []))[1].append(i)
        for node, (pool, indices) in groups.items():
            alone += self._exchange_with(
                node, pool, indices, keys, outs, claims, cells, bounce, answers
            )
        for i in sorted(alone):
            answers[i] = self._get(sealer, keys[i], outs[i], claims[i], bounce)
        return answers

    def _exchange_with(
        self,
        node: str,
        pool: ConnectionPool,
        indices: list[int],
        keys: Sequence[bytes],
        outs: Sequence[memoryview],
        claims: Sequence[LoadClaim],
        cells: Sequence[bytearray | None],
        bounce: memoryview,
        answers: list[bool],
    ) -> list[int]:
        """Exchange the keys at ``indices`` with ``node`` (``batch.MAX_GETS`` at a time),
        setting their ``answers``; returns the indices left to a GET of their own."""
        alone: list[int] = []
        breaker = self._breaker(node)
        failures = 0  # this server's faults so far, each retried as a GET would be
        while indices:
            share, indices = indices[: batch.MAX_GETS], indices[batch.MAX_GETS :]
            if not breaker.allow():
                with self._lock:
                    self._stats.breaker_skips += len(share)
                    self._stats.misses += len(share)
                continue
            try:
                done = batch.exchange(
                    pool,
                    [self._server_key(keys[i]) for i in share],
                    [outs[i] for i in share],
                    [cells[i] for i in share],  # type: ignore[misc]
                    bounce,
                    checksum=True,
                )
            except Exception as exc:  # a client bug must not reach the engine either
                done = batch.Exchanged(fault=exc)
            if done is None:  # not this connection (see batch.exchange): a GET each
                breaker.not_sent()
                alone += share
                continue
            for i, landed in zip(share, done.landed, strict=False):
                answers[i] = self._land(keys[i], outs[i], claims[i], landed)
            for i, reply in zip(share[len(done.landed) :], done.replies, strict=False):
                if reply is batch.NOT_SENT:
                    continue  # abandoned before it was asked for: not loaded
                if reply is None:
                    self._view.forget(keys[i])
                    self._miss()
                else:  # another length, an error reply (MOVED...): the GET handles it
                    alone.append(i)
            unanswered = share[done.answered :]
            if done.fault is None:
                breaker.success()
                indices = unanswered + indices  # not sent yet: the next exchange
            elif failures < self.config.retries and isinstance(done.fault, _RETRIED):
                failures += 1
                breaker.not_sent()  # a probe is decided by the retry
                time.sleep(retry_pause_s(failures))
                indices = unanswered + indices  # on a new connection (this one is closed)
            else:
                with contextlib.suppress(_Unavailable):
                    self._failed(node, breaker, done.fault)
                with self._lock:
                    self._stats.misses += len(unanswered)
        return alone

    def _pool_of(self, server_key: bytes) -> tuple[str, ConnectionPool]:
        """The node that holds ``server_key`` and its connection pool."""
        if isinstance(self._client, RedisCluster):
            node = self._client.get_node_from_key(server_key)
            return str(node.name), self._client.get_redis_connection(node).connection_pool
        return self._node_of(server_key), self._client.connection_pool

    def _land(self, key: bytes, out: memoryview, claim: LoadClaim, landed: batch.Landed) -> bool:
        """Check a value an exchange copied into ``out`` (header, length, checksum); True
        when it is the record of ``key`` and its load was not abandoned meanwhile."""
        if not landed.found:
            self._view.forget(key)
            return self._miss()
        if not landed.copied:
            return False  # the load was abandoned before the copy: out untouched
        try:
            header = decode_header(landed.header, self._digest, key)
            if header.payload_len != out.nbytes:
                raise CorruptRecordError(
                    "length",
                    f"value holds {out.nbytes} payload bytes, header says {header.payload_len}",
                )
            # With the checksum computed during the receive the row is not read again; else
            # it is, and a row abandoned meanwhile may hold another load's bytes by then.
            verify_payload(header, out, landed.payload_checksum)
        except CorruptRecordError as exc:
            if not claim.abandoned:
                self._drop_corrupt(key, self._server_key(key), exc)
            return self._miss()
        if claim.abandoned:
            return False  # reported failed by the scheduler; its row is vLLM's again
        self._view.remember(key, header.payload_len)
        self._count_hit(header.payload_len, direct=True, batched=True)
        return True

    def _count_hit(self, payload_len: int, direct: bool, batched: bool = False) -> None:
        with self._lock:
            self._stats.hits += 1
            self._stats.direct_hits += direct
            self._stats.batched_hits += batched
            self._stats.bytes_read += payload_len

    def _contains(self, sealer: RecordSealer | None, key: bytes) -> bool:
        """In the in-memory view (stored or found by this process); no network I/O."""
        return any(name in self._view for name in self._names(sealer, key))

    def _delete(self, sealer: RecordSealer | None, key: bytes) -> bool:
        """DEL on the server; True if the server removed a value (False on a fault)."""
        removed = False
        for name in self._names(sealer, key):
            self._view.forget(name)
            with self._lock:
                self._known.pop(name, None)
            if self._closed:
                return False
            server_key = self._server_key(name)
            with contextlib.suppress(_Unavailable):
                removed |= bool(
                    self._call(server_key, lambda sk=server_key: self._client.delete(sk))
                )
        return removed

    def _keys(self, sealer: RecordSealer | None) -> Iterator[bytes]:
        """Keys of the in-memory view (a snapshot); for sealed values, the block keys of
        ``sealer``'s tenant this process stored or loaded (a name cannot be turned back into
        its key)."""
        names = self._view.snapshot()
        if sealer is None:
            return iter(names)
        with self._lock:
            known = [self._known.get(n) for n in names]
        return iter([k[0] for k in known if k is not None and k[1] is sealer])

    def _payload_len(self, sealer: RecordSealer | None, key: bytes) -> int | None:
        return self._view.payload_len(self._find(sealer, key))

    def used_bytes(self) -> int:
        """Record bytes of the keys in this process's view; the server's total is not known
        here (it is bounded by the server's maxmemory, not by this store)."""
        return self._view.record_bytes

    def stats(self) -> SharedStoreStats:
        with self._lock:
            snapshot = self._stats.copy()
            breakers = list(self._breakers.values())
        snapshot.breaker_openings = sum(b.openings for b in breakers)
        snapshot.reconnects = sum(b.recoveries for b in breakers)
        return snapshot

    def _exists_many(self, sealer: RecordSealer | None, keys: Iterable[bytes]) -> set[bytes]:
        """Which of ``keys`` the server holds now; learns them (and their lengths) into the view.

        One pipelined STRLEN per key, batched per Cluster node, so the cost is about one round
        trip per node per 1024 keys. Keys on a node that is unreachable (or whose breaker is
        open) are reported absent but stay in the view. Blocking: call it from the tier's
        threads, not the scheduler. A value too short to be a record counts as absent.
        """
        if sealer is None:
            return self._check(keys)[0]
        by_name = {name: key for key in keys for name in self._names(sealer, key)}
        return {by_name[name] for name in self._check(by_name)[0]}

    def _check(self, keys: Iterable[bytes]) -> tuple[set[bytes], set[bytes]]:
        """(found, gone): gone are keys a server answered for and does not hold."""
        wanted = list(dict.fromkeys(keys))
        for key in wanted:
            check_key(key)
        found: set[bytes] = set()
        gone: set[bytes] = set()
        if self._closed or not wanted:
            return found, gone
        groups: dict[str, list[bytes]] = {}
        for key in wanted:
            try:
                node = self._node_of(self._server_key(key))
            except Exception:
                node = "cluster"
            groups.setdefault(node, []).append(key)
        for group in groups.values():
            for start in range(0, len(group), _EXISTS_BATCH):
                self._check_batch(group[start : start + _EXISTS_BATCH], found, gone)
        return found, gone

    def _check_batch(self, batch: list[bytes], found: set[bytes], gone: set[bytes]) -> None:
        server_keys = [self._server_key(k) for k in batch]

        def run() -> list[Any]:
            pipe = self._client.pipeline(transaction=False)
            for sk in server_keys:
                pipe.strlen(sk)
            return pipe.execute()

        try:
            lengths = self._call(server_keys[0], run)
        except _Unavailable:
            return  # no answer is not absence: the view keeps these keys
        for key, length in zip(batch, lengths, strict=True):
            if isinstance(length, int) and length >= HEADER_BYTES:
                self._view.remember(key, length - HEADER_BYTES)
                found.add(key)
            else:
                self._view.forget(key)
                gone.add(key)

    def refresh(self) -> int:
        """Re-check the view's ``REFRESH_BATCH`` oldest keys; returns how many left the view.

        Bounded on purpose: a tier may call this every second, and the view can hold 10^5+
        keys. Keys found again become the newest, so successive calls sweep the whole view.
        Other replicas' new keys are not listed here (that would need a SCAN): they are
        learnt by ``exists_many``.
        """
        return len(self._check(self._view.oldest(REFRESH_BATCH))[1])

    def verify(self, fix: bool = False) -> list[Problem]:
        """SCAN this namespace's keys on every master and fully verify each value.

        A value that fails is reported as ``corrupt`` (deleted with ``fix``); an unreachable
        server as ``unreachable``. A sealed value whose checksums hold but whose tag fails
        under the store's tenant is ``unauthenticated`` and never deleted: it may be another
        tenant's (kvtier.store.tenant_view). View keys the server has evicted leave the view
        silently (eviction is normal for a cache).
        """
        return self._verify(self._sealer, fix)

    def _verify(self, sealer: RecordSealer | None, fix: bool) -> list[Problem]:
        if self._closed:
            return []
        problems: list[Problem] = []
        clients = startup.masters(self._client)
        seen: set[bytes] = set()
        for client in clients:
            try:
                server_keys = list(client.scan_iter(match=self._prefix + b"*", count=1000))
                for sk in server_keys:
                    problem = self._verify_one(sealer, client, sk, fix)
                    seen.add(sk)
                    if problem is not None:
                        problems.append(problem)
            except Exception as exc:
                problems.append(
                    Problem("unreachable", self._scrubbed(f"{type(exc).__name__}: {exc}"))
                )
                return problems
        for key in self._view.snapshot():
            if self._server_key(key) not in seen:
                self._view.forget(key)
        return problems

    def _verify_one(
        self, sealer: RecordSealer | None, client: Any, server_key: bytes, fix: bool
    ) -> Problem | None:
        try:
            key = bytes.fromhex(server_key[len(self._prefix) :].decode())
            check_key(key)
        except ValueError:
            key = None
        value = client.get(server_key)
        if value is None:
            return None
        try:
            if key is None:
                raise CorruptRecordError("key", f"server key {server_key!r:.80} is not ours")
            raw = memoryview(value)
            header = decode_header(raw, self._digest, key, raw.nbytes - HEADER_BYTES)
            if sealer is not None:
                sealer.verify(header, raw[HEADER_BYTES:])
            elif header.seal is not None:
                # Without the key only the ciphertext's integrity can be checked; deleting
                # what cannot be opened here would empty an encrypted server.
                verify_stored_bytes(header, raw[HEADER_BYTES:])
            else:
                verify_payload(header, raw[HEADER_BYTES:])
        except CorruptRecordError as exc:
            if exc.reason == "auth":  # checksums held: maybe another tenant's, kept
                return Problem("unauthenticated", str(exc), key=key)
            if fix:
                client.delete(server_key)
                if key is not None:
                    self._view.forget(key)
            return Problem("corrupt", str(exc), key=key, fixed=fix)
        return None

    def without_server(self) -> BlockStore | None:
        return None  # every record lives on the server

    def close(self) -> None:
        """Close the connections; idempotent. Later operations miss or return False."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        with contextlib.suppress(Exception):  # closing a half-dead connection must not raise
            self._client.close()

    def __repr__(self) -> str:
        return (
            f"SharedStore(url={self._server.redacted!r}, "
            f"namespace={self.namespace.digest_hex()}, closed={self._closed})"
        )


def _landing(dest: memoryview, claim: LoadClaim | None, bounce: object) -> memoryview | None:
    """Where a GET's payload may be read raw: ``dest`` itself when nothing has to be claimed
    (a plain ``get_into`` may leave part of a value in ``out``), else the first
    ``dest.nbytes`` of a writable ``bounce``; None when neither applies (the client's bytes
    are used, as before)."""
    if not READ_INTO_AVAILABLE or dest.readonly:  # a read-only out fails as before, at the copy
        return None
    if claim is None:
        return dest
    if bounce is None:
        return None
    try:
        view = memoryview(bounce).cast("B")  # type: ignore[arg-type]
    except TypeError:
        return None
    if view.readonly or view.nbytes < dest.nbytes:
        return None
    return view[: dest.nbytes]
