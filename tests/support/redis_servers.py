"""The shared-tier tests' servers: kvtier.bench.redis_servers (the bench starts the same ones).

Kept as the tests' import point so a test module imports only from tests.support.
"""

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
    "RedisClusterServers",
    "RedisServer",
    "cli_binary",
    "free_port",
    "server_binary",
    "start_cluster",
    "start_standalone",
]
