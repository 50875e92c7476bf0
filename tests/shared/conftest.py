"""Fixtures of the shared-tier tests: throw-away Redis servers on loopback.

Session-scoped servers (one standalone, one 3-master Cluster) serve the tests that do not harm
them; each test uses its own namespace there, so tests never see each other's keys. Tests that
kill, freeze, fill or reconfigure a server get their own through ``fresh_server``. Everything
is skipped, with the reason, only when no redis-server binary is installed.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtier.format import Namespace
from tests.support.redis_servers import (
    RedisClusterServers,
    RedisServer,
    cli_binary,
    server_binary,
    start_cluster,
    start_standalone,
)
from tests.support.store import make_namespace

_NO_SERVER = "no redis-server on PATH (run scripts/redis-server.sh, or set KVTIER_REDIS_SERVER)"


def _need_server() -> None:
    if server_binary() is None:
        pytest.skip(_NO_SERVER)


@pytest.fixture(scope="session")
def redis_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    _need_server()
    server = start_standalone(tmp_path_factory.mktemp("redis-standalone"))
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    _need_server()
    if cli_binary() is None:
        pytest.skip("no redis-cli on PATH to create a Cluster (run scripts/redis-server.sh)")
    cluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"))
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_cluster(tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A 3-master Cluster private to one test (which may kill nodes or move slots); stopped
    after. Costs the ~3 s of cluster set-up."""
    _need_server()
    if cli_binary() is None:
        pytest.skip("no redis-cli on PATH to create a Cluster (run scripts/redis-server.sh)")
    cluster = start_cluster(tmp_path / "cluster")
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_server(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Factory for servers private to one test (options as ``RedisServer``); killed after."""
    _need_server()
    started: list[RedisServer] = []

    def start(**options: object) -> RedisServer:
        server = start_standalone(tmp_path / f"server{len(started)}", **options)
        started.append(server)
        return server

    yield start
    for server in started:
        server.kill()


@pytest.fixture
def unique_namespace() -> Callable[[], Namespace]:
    """Namespaces no other test uses, so a shared server needs no flushing between tests."""
    return lambda: make_namespace(model=f"shared-test/{uuid.uuid4().hex}")
