"""Fail loudly when the redis-py / hiredis internals the shared tier relies on change shape.

Written for redis==8.1.0 and hiredis==3.5.0 (requirements/dev.txt). The direct GET
(``kvtier.store.shared.readinto`` through ``client._ReadIntoMixin``) and the zero-copy writer
(``client.RecordPacker``) reach below redis-py's public API: a connection's parser and its
hiredis reader, its socket, its command packer, the way command options travel from
``execute_command`` to ``send_command``, the Cluster's pool class. Each test names one of
those things. If one fails after an upgrade, read the upstream change and adapt
``kvtier/store/shared`` before relaxing the test (or widening the versions below).

The first tests read redis-py's classes and source, no server needed; the last ones open a real
connection (skipped, with the reason, when no redis-server is installed).
"""

from __future__ import annotations

import inspect
from importlib.metadata import version

import hiredis
import pytest
import redis
import redis.backoff
import redis.client
import redis.cluster
import redis.connection
import redis.exceptions
import redis.retry
import redis.utils
from redis._parsers import _HiredisParser
from redis._parsers import socket as redis_socket

from kvtier.store.shared import client, readinto
from kvtier.store.shared.readinto import OPTION, ReadInto
from tests.support.redis_servers import RedisServer

#: The releases this file was checked against, and the ranges it is believed to hold for:
#: the same minor release of redis-py (its private internals may change in any minor), any
#: hiredis 3 from 3.5 (its ``Reader`` API is public and stable).
REDIS_TESTED, REDIS_RANGE = "8.1.0", ((8, 1), (8, 2))
HIREDIS_TESTED, HIREDIS_RANGE = "3.5.0", ((3, 5), (4, 0))


def _release(name: str) -> tuple[int, int]:
    major, minor = version(name).split(".")[:2]
    return int(major), int(minor)


def _params(fn: object) -> list[str]:
    return list(inspect.signature(fn).parameters)  # type: ignore[arg-type]


def _source(obj: object) -> str:
    return inspect.getsource(obj)  # type: ignore[arg-type]


def test_installed_releases_are_the_ones_this_contract_covers():
    for name, tested, (low, high) in (
        ("redis", REDIS_TESTED, REDIS_RANGE),
        ("hiredis", HIREDIS_TESTED, HIREDIS_RANGE),
    ):
        assert low <= _release(name) < high, (
            f"{name} {version(name)} is outside {low}..{high} (this contract was written for "
            f"{name}=={tested}); run tests/shared/test_redis_contract.py and "
            "tests/shared/test_shared_readinto.py against it, then widen the range here and in "
            "pyproject's [shared] extra"
        )


def test_redis_py_uses_hiredis_as_its_parser():
    assert redis.utils.HIREDIS_AVAILABLE, (
        "redis-py does not accept the installed hiredis: every GET goes through its Python "
        "parser and the direct read (client._ReadIntoMixin) never applies"
    )
    assert redis.connection.DefaultParser is _HiredisParser, (
        "redis.connection.DefaultParser is no longer _HiredisParser: the direct read checks "
        "connection._parser._reader is a hiredis.Reader"
    )
    assert "self._reader = hiredis.Reader(" in _source(_HiredisParser.on_connect), (
        "_HiredisParser no longer keeps its hiredis.Reader in ._reader "
        "(client._ReadIntoMixin.read_response feeds it the bytes a raw read did not match)"
    )


def test_hiredis_reader_takes_a_slice_of_a_buffer_and_says_what_it_holds():
    reader = hiredis.Reader()
    assert not reader.has_data()
    reader.feed(bytearray(b"+OK\r\n$3\r\nabXX"), 0, 11)  # feed(buffer, offset, length)
    assert reader.gets() == b"OK"
    assert reader.has_data(), "hiredis.Reader.has_data() must report a half-fed reply"
    reader.feed(b"c\r\n")
    assert reader.gets() == b"abc"


def test_a_server_cut_reply_raises_redis_pys_own_text():
    assert redis_socket.SERVER_CLOSED_CONNECTION_ERROR == readinto._CLOSED, (
        "redis._parsers.socket.SERVER_CLOSED_CONNECTION_ERROR changed: readinto._CLOSED "
        "copies it so a cut direct read reads like a cut parsed one"
    )


def test_command_options_reach_send_command_and_read_response_gets_none():
    """``execute_command("GET", key, kvtier_read_into=...)`` must hand the option to the
    connection's ``send_command`` unchanged and read the reply with a bare
    ``read_response()`` (the mixin reads raw only then), on both clients."""
    standalone = _source(redis.client.Redis._send_command_parse_response)
    assert "conn.send_command(*args, **options)" in standalone, (
        "Redis._send_command_parse_response no longer passes command options to send_command"
    )
    parse = _source(redis.client.Redis.parse_response)
    assert "response = connection.read_response()" in parse, (
        "Redis.parse_response no longer reads a plain reply with a bare read_response()"
    )
    cluster = _source(redis.cluster.RedisCluster._execute_command)
    assert "connection.send_command(*args, **kwargs)" in cluster, (
        "RedisCluster._execute_command no longer passes command options to send_command"
    )
    assert "redis_node.parse_response(connection, command, **kwargs)" in cluster


def test_get_has_no_response_callback():
    """A callback would receive the ``ReadInto`` the direct read returns instead of bytes."""
    for protocol in (2, 3):
        plain = redis.Redis(protocol=protocol)  # connects lazily: no server needed
        assert "GET" not in plain.response_callbacks, f"RESP{protocol} GET got a callback"


def test_connection_methods_the_mixin_overrides_keep_their_signatures():
    conn = redis.connection.Connection
    assert _params(conn.send_command) == ["self", "args", "kwargs"]
    assert _params(conn.send_packed_command) == ["self", "command", "check_health"]
    assert _params(conn.disconnect) == ["self", "args", "kwargs"]
    assert _params(conn.read_response)[:2] == ["self", "disable_decoding"]
    send = _source(conn.send_command)
    assert "self.send_packed_command(" in send and "self._command_packer.pack(*args)" in send, (
        "Connection.send_command no longer packs with _command_packer.pack and sends with "
        "send_packed_command (the mixin sets its pending read after send_command)"
    )
    read = _source(conn.read_response)
    assert "self.next_health_check = time.monotonic() + self.health_check_interval" in read, (
        "Connection.read_response changed how it schedules the next health check; "
        "client._ReadIntoMixin.read_response does the same after a direct read"
    )


def test_the_command_packer_is_chosen_by_one_overridable_method():
    conn = redis.connection.Connection
    assert _params(conn._construct_command_packer) == ["self", "packer"]
    init = "".join(
        _source(c.__init__)
        for c in conn.__mro__
        if c.__module__ == "redis.connection" and "__init__" in c.__dict__
    )
    assert "self._command_packer = self._construct_command_packer(" in init, (
        "Connection.__init__ no longer builds its packer with _construct_command_packer: "
        "RecordConnection's zero-copy RecordPacker would be ignored (5x slower MiB SETs)"
    )
    assert "self.encoder = Encoder(" in init
    assert "self._command_packer.pack(" in _source(conn.pack_commands)
    assert issubclass(redis.connection.SSLConnection, conn)
    assert client.RecordSSLConnection._construct_command_packer is not (
        conn._construct_command_packer
    )


def test_the_cluster_builds_node_pools_from_its_pool_class_given_a_url():
    assert "connection_pool_class" in _params(redis.cluster.NodesManager.__init__)
    source = _source(redis.cluster.NodesManager.create_redis_node)
    assert "if self.from_url:" in source and "self.connection_pool_class(**kwargs)" in source, (
        "RedisCluster no longer builds node pools from connection_pool_class when given a url: "
        "client.build_cluster's RecordPool (and the direct read) would not reach the nodes"
    )
    assert "connection_class" in _params(redis.connection.ConnectionPool.__init__)
    assert callable(redis.cluster.RedisCluster.get_node_from_key)
    assert _params(redis.cluster.ClusterNode.__init__)[1:3] == ["host", "port"]


def test_retry_and_backoff_take_the_arguments_the_client_gives():
    assert _params(redis.backoff.ExponentialWithJitterBackoff.__init__)[1:] == ["cap", "base"]
    assert _params(redis.retry.Retry.__init__)[1:3] == ["backoff", "retries"]


def test_the_exceptions_the_store_maps_still_exist():
    for name in (
        "AuthenticationError",
        "AuthorizationError",
        "ClusterDownError",
        "ConnectionError",
        "InvalidResponse",
        "NoPermissionError",
        "OutOfMemoryError",
        "RedisClusterException",
        "ResponseError",
        "SlotNotCoveredError",
        "TimeoutError",
    ):
        assert isinstance(getattr(redis.exceptions, name, None), type), name


# -- on a live connection ------------------------------------------------------------------
@pytest.fixture
def connection(redis_standalone: RedisServer):
    conn = client.RecordConnection(port=redis_standalone.port)
    conn.connect()
    yield conn
    conn.disconnect()


def test_a_connected_record_connection_has_the_attributes_the_mixin_reads(connection):
    assert isinstance(connection._parser, _HiredisParser)
    assert isinstance(connection._parser._reader, hiredis.Reader)
    assert callable(connection._sock.recv_into), "connection._sock must offer recv_into"
    assert isinstance(connection.host, str) and isinstance(connection.port, int)
    assert isinstance(connection.health_check_interval, int | float)
    assert isinstance(connection.next_health_check, int | float)
    assert isinstance(connection._command_packer, client.RecordPacker)


def test_a_get_with_the_option_is_read_straight_into_the_callers_buffer(redis_standalone):
    pool = client.RecordPool(port=redis_standalone.port)
    plain = redis.Redis(connection_pool=pool)
    try:
        value = b"h" * 8 + b"p" * 56
        plain.set(b"kvtier-contract", value)
        payload = memoryview(bytearray(56))
        request = ReadInto(8, payload)
        got = plain.execute_command("GET", b"kvtier-contract", **{OPTION: request})
        assert got is request, "the reply went through the parser, not the direct read"
        assert bytes(request.head) == b"h" * 8 and bytes(payload) == b"p" * 56
        assert plain.get(b"kvtier-contract") == value, "the connection serves the next GET"
    finally:
        plain.delete(b"kvtier-contract")
        pool.disconnect()
