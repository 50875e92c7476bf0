"""Fixtures of the shared-tier tests: throw-away servers on loopback.

Every test here runs once per server kind (``SERVER_KINDS``: the distribution's redis-server
and the Valkey and Redis releases scripts/server-binaries.sh fetches); a kind whose binary is
not installed is skipped, with the reason. Tests marked ``client_side`` (what kvtier's client
does with a cut or stalled reply, a dead server) run on the first kind installed only.
Session-scoped servers (one standalone, one 3-master Cluster) serve the tests that do not harm
them; each test uses its own namespace there, so tests never see each other's keys. Tests that
kill, freeze, fill or reconfigure a server get their own through ``fresh_server``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from kvtier.format import Namespace
from kvtier.store.shared import SharedStore
from tests.support.redis_servers import (
    SERVER_KINDS,
    RedisClusterServers,
    RedisServer,
    kind_binary,
    start_cluster,
    start_standalone,
)
from tests.support.shared_store import open_shared
from tests.support.store import make_namespace


@pytest.fixture(scope="session", params=SERVER_KINDS)
def server_of_kind(request: pytest.FixtureRequest) -> str:
    """The server binary of this run's server kind."""
    try:
        return kind_binary(request.param)
    except LookupError as missing:
        pytest.skip(str(missing))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``client_side`` check what kvtier's client does with what reaches it (a
    reply cut or stalled part-way, a server gone), which no server release changes: they run
    on the first server kind installed here only, and are deselected for the others."""
    first = next((kind for kind in SERVER_KINDS if _installed(kind)), None)
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        callspec = getattr(item, "callspec", None)
        kind = callspec.params.get("server_of_kind") if callspec is not None else None
        if item.get_closest_marker("client_side") and kind not in (None, first):
            dropped.append(item)
        else:
            kept.append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _installed(kind: str) -> bool:
    try:
        kind_binary(kind)
    except LookupError:
        return False
    return True


class _SessionServers:
    """One standalone server and one Cluster per server kind, each started on first use and
    kept until the session ends. A session fixture parametrized by kind would be torn down and
    started again at every switch of kind, which pytest makes in every file (a Cluster costs
    about 2 s: a master reports ``cluster_state:ok`` no sooner than 2 s after it starts)."""

    def __init__(self, folder: Path) -> None:
        self._folder = folder
        self._standalone: dict[str, RedisServer] = {}
        self._clusters: dict[str, RedisClusterServers] = {}

    def standalone(self, binary: str) -> RedisServer:
        if binary not in self._standalone:
            folder = self._folder / f"standalone{len(self._standalone)}"
            self._standalone[binary] = start_standalone(folder, binary=binary)
        return self._standalone[binary]

    def cluster(self, binary: str) -> RedisClusterServers:
        if binary not in self._clusters:
            folder = self._folder / f"cluster{len(self._clusters)}"
            self._clusters[binary] = start_cluster(folder, binary=binary)
        return self._clusters[binary]

    def stop(self) -> None:
        for server in self._standalone.values():
            server.kill()
        for cluster in self._clusters.values():
            cluster.stop()


@pytest.fixture(scope="session")
def session_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_SessionServers]:
    servers = _SessionServers(tmp_path_factory.mktemp("session-servers"))
    yield servers
    servers.stop()


@pytest.fixture
def redis_standalone(server_of_kind: str, session_servers: _SessionServers) -> RedisServer:
    """This kind's standalone server, shared by the tests that do not harm it."""
    return session_servers.standalone(server_of_kind)


@pytest.fixture
def redis_cluster(server_of_kind: str, session_servers: _SessionServers) -> RedisClusterServers:
    """This kind's 3-master Cluster, shared by the tests that do not harm it."""
    return session_servers.cluster(server_of_kind)


@pytest.fixture
def fresh_cluster(server_of_kind: str, tmp_path: Path) -> Iterator[RedisClusterServers]:
    """A 3-master Cluster private to one test (which may kill nodes or move slots); stopped
    after."""
    cluster = start_cluster(tmp_path / "cluster", binary=server_of_kind)
    yield cluster
    cluster.stop()


@pytest.fixture
def fresh_server(server_of_kind: str, tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Factory for servers private to one test (options as ``RedisServer``); killed after."""
    started: list[RedisServer] = []

    def start(**options: object) -> RedisServer:
        options.setdefault("binary", server_of_kind)
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


@pytest.fixture
def store(
    redis_standalone: RedisServer, unique_namespace: Callable[[], Namespace]
) -> Iterator[SharedStore]:
    """A plain store on this kind's standalone server, in a namespace of its own."""
    with open_shared(redis_standalone.url, unique_namespace()) as opened:
        yield opened


@pytest.fixture
def raw(redis_standalone: RedisServer) -> Iterator[redis.Redis]:
    """A plain redis-py client of this kind's standalone server (to damage values)."""
    client = redis.Redis(port=redis_standalone.port)
    yield client
    client.close()
