"""Fixtures of the shared-tier tests: throw-away servers on loopback.

Every test here runs once per server kind (``SERVER_KINDS``: the distribution's redis-server and
the Valkey releases scripts/valkey-server.sh fetches); a kind whose binary is not installed is
skipped, with the reason. Session-scoped servers (one standalone, one 3-master Cluster) serve
the tests that do not harm them; each test uses its own namespace there, so tests never see
each other's keys. Tests that kill, freeze, fill or reconfigure a server get their own through
``fresh_server``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtier.format import Namespace
from tests.support.redis_servers import (
    SERVER_KINDS,
    RedisClusterServers,
    RedisServer,
    kind_binaries,
    start_cluster,
    start_standalone,
)
from tests.support.store import make_namespace

_NO_CLI = "no redis-cli or valkey-cli to create a Cluster (run scripts/redis-server.sh)"


@pytest.fixture(scope="session", params=SERVER_KINDS)
def server_binaries(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """(server binary, cli binary or None) of this run's server kind."""
    found = kind_binaries(request.param)
    if isinstance(found, str):
        pytest.skip(found)
    return found


@pytest.fixture(scope="session")
def redis_standalone(
    server_binaries: tuple[str, str | None], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisServer]:
    server = start_standalone(
        tmp_path_factory.mktemp("redis-standalone"), binary=server_binaries[0]
    )
    yield server
    server.kill()


@pytest.fixture(scope="session")
def redis_cluster(
    server_binaries: tuple[str, str | None], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RedisClusterServers]:
    binary, cli = server_binaries
    if cli is None:
        pytest.skip(_NO_CLI)
    cluster = start_cluster(tmp_path_factory.mktemp("redis-cluster"), binary=binary, cli=cli)
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_cluster(
    server_binaries: tuple[str, str | None], tmp_path: Path
) -> Iterator[RedisClusterServers]:
    """A 3-master Cluster private to one test (which may kill nodes or move slots); stopped
    after. Costs the ~3 s of cluster set-up."""
    binary, cli = server_binaries
    if cli is None:
        pytest.skip(_NO_CLI)
    cluster = start_cluster(tmp_path / "cluster", binary=binary, cli=cli)
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_server(
    server_binaries: tuple[str, str | None], tmp_path: Path
) -> Iterator[Callable[..., RedisServer]]:
    """Factory for servers private to one test (options as ``RedisServer``); killed after."""
    started: list[RedisServer] = []

    def start(**options: object) -> RedisServer:
        options.setdefault("binary", server_binaries[0])
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
