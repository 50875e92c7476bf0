"""The shared-tier tests' servers: kvtier.bench.redis_servers (the bench starts the same ones),
and the server kinds tests/shared runs against.

Kept as the tests' import point so a test module imports only from tests.support.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvtier.bench.redis_servers import (
    SERVER_ENV,
    RedisClusterServers,
    RedisServer,
    free_port,
    server_binary,
    start_cluster,
    start_standalone,
)

__all__ = [
    "FETCHED",
    "SERVER_ENV",
    "SERVER_KINDS",
    "RedisClusterServers",
    "RedisServer",
    "fetched_servers",
    "free_port",
    "kind_binary",
    "server_binary",
    "start_cluster",
    "start_standalone",
]

#: The servers every test of tests/shared runs against: the distribution's redis-server, and
#: the releases scripts/server-binaries.sh fetches (kind -> its folder under that cache).
FETCHED = {"valkey-9.1": "valkey-9.1.2", "valkey-8.1": "valkey-8.1.8", "redis-6.2": "redis-6.2.14"}
SERVER_KINDS = ("redis", *FETCHED)


def fetched_servers() -> Path:
    """Where scripts/server-binaries.sh puts the releases it fetches."""
    root = os.environ.get("KVTIER_CACHE_DIR") or str(Path.home() / ".cache" / "kvtier")
    return Path(root) / "servers"


def kind_binary(kind: str) -> str:
    """The server binary of a server kind of ``SERVER_KINDS``; raises ``LookupError`` saying
    why there is none here (the reason a test skips with)."""
    if kind == "redis":
        server = server_binary()
        if server is None:
            raise LookupError(
                f"no redis-server on PATH (run scripts/redis-server.sh, or set {SERVER_ENV})"
            )
        return server
    release = FETCHED[kind]
    server = fetched_servers() / release / f"{release.split('-')[0]}-server"
    if not os.access(server, os.X_OK):
        raise LookupError(f"no {server} (run scripts/server-binaries.sh)")
    return str(server)
