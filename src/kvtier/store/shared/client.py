"""Building redis-py clients for the shared tier, with a zero-copy writer for records.

redis-py with hiredis installed packs every command with hiredis, which copies a large value
twice (``bytes(memoryview)``, then the packed command): SETs of MiB values run ~5x slower than
with the pure-Python packer. Reads are the other way round (the hiredis parser is 2-3x faster).
So the connections built here keep the hiredis *parser* and use ``RecordPacker`` for writes:
RESP framing of its own, and a ``RecordValue`` argument (header + payload, two buffers) goes to
the socket as two chunks, so a put never concatenates the 4 KiB header with a MiB payload.

Reads: a GET sent with the ``readinto.OPTION`` keyword (a ``ReadInto``) has its reply read by
``readinto.read_reply_into`` straight into the caller's buffers instead of by the parser (see
that module for what is read raw and what is handed back to the parser). The command still
goes through redis-py's ``execute_command``: its pool, AUTH/HELLO, TLS socket, retries,
health checks and Cluster routing (MOVED/ASK included) are untouched. The raw read happens only
when the connection's parser is hiredis with nothing buffered; otherwise the parser reads.

redis-py passes our connection class down to Cluster nodes only through a custom pool class
(``RedisCluster(connection_pool_class=...)`` with a ``url``), hence ``RecordPool``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.backoff import ExponentialWithJitterBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.connection import Connection, ConnectionPool, SSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry

from kvtier.settings import SharedTierSettings
from kvtier.store.shared import readinto

try:
    import hiredis
except ImportError:  # redis-py then parses in Python, and replies are read by its parser
    hiredis = None

#: Whether GET replies can be read into the caller's buffers (needs the hiredis reader).
READ_INTO_AVAILABLE = hiredis is not None

# Arguments longer than this are sent as their own chunk instead of being copied into the
# command buffer (the same trade-off redis-py makes).
_CHUNK_CUTOFF = 6000


class RecordValue:
    """One RESP bulk string made of several buffers, sent without joining them."""

    __slots__ = ("nbytes", "parts")

    def __init__(self, parts: Sequence[memoryview | bytes]) -> None:
        self.parts = tuple(memoryview(p).cast("B") for p in parts)
        self.nbytes = sum(p.nbytes for p in self.parts)

    def __len__(self) -> int:
        return self.nbytes


class RecordPacker:
    """RESP command packer: chunks big arguments, sends ``RecordValue`` parts as they are."""

    def __init__(self, encode: Callable[[Any], bytes | memoryview]) -> None:
        self._encode = encode

    def pack(self, *args: Any) -> list[bytes | memoryview]:
        first = args[0]
        # redis-py passes multi-word commands ("CONFIG GET") as one argument.
        if isinstance(first, str):
            args = (*first.encode().split(), *args[1:])
        elif isinstance(first, bytes) and b" " in first:
            args = (*first.split(), *args[1:])
        chunks: list[bytes | memoryview] = []
        head = bytearray(b"*%d\r\n" % len(args))
        for arg in args:
            parts = arg.parts if isinstance(arg, RecordValue) else (self._encode(arg),)
            size = sum(len(p) if isinstance(p, bytes) else p.nbytes for p in parts)
            head += b"$%d\r\n" % size
            if size > _CHUNK_CUTOFF or isinstance(arg, RecordValue):
                chunks.append(bytes(head))
                chunks.extend(parts)
                head = bytearray(b"\r\n")
            else:
                for p in parts:
                    head += p
                head += b"\r\n"
        chunks.append(bytes(head))
        return chunks

    def encode(self, *args: Any) -> list[bytes | memoryview]:
        return self.pack(*args)


class _ReadIntoMixin:
    """Connection mixin: the reply to a command sent with ``readinto.OPTION`` is read by
    ``readinto.read_reply_into`` when the parser holds no bytes (see the module docstring).

    A connection serves one thread at a time (redis-py's pool), so the pending ``ReadInto``
    is plain connection state: set once the command is on the wire (after the health-check
    PING that ``send_command`` may send and read first), consumed by the next read.
    """

    _read_into: readinto.ReadInto | None = None

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        target = kwargs.get(readinto.OPTION)
        self._read_into = None
        super().send_command(*args, **kwargs)  # type: ignore[misc]
        if isinstance(target, readinto.ReadInto):
            self._read_into = target

    def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        self._read_into = None  # pipelines and raw sends are always read by the parser
        super().send_packed_command(command, check_health)  # type: ignore[misc]

    def disconnect(self, *args: Any, **kwargs: Any) -> None:
        self._read_into = None
        super().disconnect(*args, **kwargs)  # type: ignore[misc]

    def read_response(self, *args: Any, **kwargs: Any) -> Any:
        target, self._read_into = self._read_into, None
        reader = getattr(getattr(self, "_parser", None), "_reader", None)
        sock = getattr(self, "_sock", None)
        if (
            target is None
            or args
            or kwargs
            or sock is None
            or hiredis is None
            or not isinstance(reader, hiredis.Reader)
            or reader.has_data()
        ):
            return super().read_response(*args, **kwargs)  # type: ignore[misc]
        where = f"{self.host}:{self.port}"  # type: ignore[attr-defined]
        # The same mapping as redis-py's own read_response: disconnect first, so a half-read
        # connection never returns to the pool.
        try:
            filled = readinto.read_reply_into(sock, target, lambda buf, n: reader.feed(buf, 0, n))
        except TimeoutError:  # socket.timeout; redis.exceptions.TimeoutError is not one
            self.disconnect()
            raise RedisTimeoutError(f"Timeout reading from {where}") from None
        except OSError as exc:
            self.disconnect()
            raise RedisConnectionError(f"Error while reading from {where} : {exc.args}") from None
        except BaseException:
            self.disconnect()
            raise
        if not filled:  # another reply: the parser has its first bytes and reads the rest
            return super().read_response()  # type: ignore[misc]
        if self.health_check_interval:  # type: ignore[attr-defined]
            self.next_health_check = time.monotonic() + self.health_check_interval  # type: ignore[attr-defined]
        return target


class RecordConnection(_ReadIntoMixin, Connection):
    """A plain TCP connection: hiredis parser (when installed), ``RecordPacker`` for writes,
    GET replies read into the caller's buffers on request (``_ReadIntoMixin``)."""

    def _construct_command_packer(self, packer: Any) -> RecordPacker:
        return RecordPacker(self.encoder.encode)


class RecordSSLConnection(_ReadIntoMixin, SSLConnection):
    """The TLS variant of ``RecordConnection`` (``ssl.SSLSocket.recv_into`` decrypts in place)."""

    def _construct_command_packer(self, packer: Any) -> RecordPacker:
        return RecordPacker(self.encoder.encode)


class RecordPool(ConnectionPool):
    """A pool that swaps redis-py's connection classes for the ``Record*`` ones."""

    def __init__(self, connection_class: type[Connection] = Connection, **kwargs: Any) -> None:
        swapped = (
            RecordSSLConnection if issubclass(connection_class, SSLConnection) else RecordConnection
        )
        super().__init__(connection_class=swapped, **kwargs)


def retry_pause_s(failures: int) -> float:
    """Seconds to wait before retry number ``failures`` (1, 2, ...): the back-off every
    operation of the shared tier retries with, a GET or a share's exchange."""
    return _backoff().compute(failures)


def _backoff() -> ExponentialWithJitterBackoff:
    # redis-py's default (10 retries, up to 1 s apart) turns a dead server into a 4-10 s stall.
    return ExponentialWithJitterBackoff(base=0.01, cap=0.1)


def _retry(config: SharedTierSettings) -> Retry:
    return Retry(_backoff(), config.retries)


def _common_kwargs(config: SharedTierSettings) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "socket_timeout": config.op_timeout_s,
        "socket_connect_timeout": config.connect_timeout_s,
        "socket_keepalive": True,
        "health_check_interval": 30,
        "username": config.username,
        "password": config.password_text,
    }
    if config.server.tls:
        kwargs.update(
            ssl_cert_reqs="required",
            ssl_ca_certs=_text(config.tls_ca_file),
            ssl_certfile=_text(config.tls_cert_file),
            ssl_keyfile=_text(config.tls_key_file),
        )
    return kwargs


def _text(path: object) -> str | None:
    return None if path is None else str(path)


def build_standalone(config: SharedTierSettings) -> redis.Redis:
    """A client for one server; connects lazily (the caller PINGs to fail early)."""
    server = config.server
    host, port = server.hosts[0]
    kwargs = _common_kwargs(config)
    if server.tls:
        kwargs["connection_class"] = SSLConnection
    pool = RecordPool(host=host, port=port, db=server.db, retry=_retry(config), **kwargs)
    return redis.Redis(connection_pool=pool, retry=_retry(config))


def build_cluster(config: SharedTierSettings) -> RedisCluster:
    """A Cluster client; connects at once (raises if no node named in the URL answers).

    ``require_full_coverage=False``: with a master down, keys on the live masters keep working
    (the servers must run with ``cluster-require-full-coverage no`` too).
    """
    server = config.server
    host, port = server.hosts[0]
    scheme = "rediss" if server.tls else "redis"
    return RedisCluster(
        url=f"{scheme}://{host}:{port}",  # no credentials in it: they go as keyword arguments
        startup_nodes=[ClusterNode(h, p) for h, p in server.hosts],
        connection_pool_class=RecordPool,
        require_full_coverage=False,
        retry=_retry(config),
        **_common_kwargs(config),
    )
