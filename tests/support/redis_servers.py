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
    cli_binary,
    free_port,
    server_binary,
    start_cluster,
    start_standalone,
)

__all__ = [
    "SERVER_ENV",
    "SERVER_KINDS",
    "RedisClusterServers",
    "RedisServer",
    "cli_binary",
    "free_port",
    "kind_binaries",
    "server_binary",
    "start_cluster",
    "start_standalone",
]

#: The servers every test of tests/shared runs against: the distribution's redis-server, and
#: the Valkey releases scripts/valkey-server.sh fetches (folders under its cache).
SERVER_KINDS = ("redis", "valkey-9.1", "valkey-8.1")
_VALKEY_FOLDERS = {"valkey-9.1": "valkey-9.1.2", "valkey-8.1": "valkey-8.1.8"}


def _valkey_cache() -> Path:
    root = os.environ.get("KVTIER_CACHE_DIR") or str(Path.home() / ".cache" / "kvtier")
    return Path(root) / "valkey"


def kind_binaries(kind: str) -> tuple[str, str | None] | str:
    """(server binary, cli binary or None) of a server kind of ``SERVER_KINDS``, or why there
    is none here (the reason a test skips with)."""
    if kind == "redis":
        server = server_binary()
        if server is None:
            return f"no redis-server on PATH (run scripts/redis-server.sh, or set {SERVER_ENV})"
        return server, cli_binary()
    folder = _valkey_cache() / _VALKEY_FOLDERS[kind]
    server = folder / "valkey-server"
    if not os.access(server, os.X_OK):
        return f"no {server} (run scripts/valkey-server.sh)"
    # Its own valkey-cli where the release ships one, else any that can create a Cluster.
    own_cli, bundled_cli = folder / "valkey-cli", _valkey_cache() / "valkey-8.1.8" / "valkey-cli"
    if os.access(own_cli, os.X_OK):
        return str(server), str(own_cli)
    fallback = str(bundled_cli) if os.access(bundled_cli, os.X_OK) else None
    return str(server), cli_binary() or fallback
