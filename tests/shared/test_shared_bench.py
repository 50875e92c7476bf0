"""``kvtier bench shared`` on each server kind: every row measured, the report names the server
it ran on (Valkey reports a Redis-compatible ``redis_version`` of its own: not that)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from kvtier.bench import shared_bench
from kvtier.bench.ttft import server_releases
from tests.support.redis_servers import RedisClusterServers, RedisServer


def test_the_bench_measures_every_row_and_names_the_server(
    redis_standalone: RedisServer,
    redis_cluster: RedisClusterServers,
    server_of_kind: str,
    tmp_path: Path,
) -> None:
    results = shared_bench.run(
        tmp_path, redis_standalone.url, redis_cluster.url, sizes=(shared_bench.MIB // 2,), passes=1
    )
    assert [row["topology"] for row in results["rows"]] == ["standalone", "cluster"]
    for row in results["rows"]:
        assert all(runs and min(runs) > 0 for runs in row["gbps"].values()), row
    named = _release_of(server_of_kind)
    assert results["versions"]["server"] == named
    assert f"server {named}" in (tmp_path / "shared.md").read_text()
    assert json.loads((tmp_path / "shared.json").read_text())["versions"] == results["versions"]


def test_the_ttft_bench_names_each_topologys_server(
    redis_standalone: RedisServer,
    redis_cluster: RedisClusterServers,
    server_of_kind: str,
) -> None:
    urls = {"standalone": redis_standalone.url, "cluster": redis_cluster.url}
    named = _release_of(server_of_kind)
    assert server_releases(urls) == {"standalone": named, "cluster": named}
    assert server_releases({}) == {}


def _release_of(binary: str) -> str:
    """What a server binary says it is: ``Redis server v=7.0.15 ...`` -> Redis 7.0.15."""
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    words = version.stdout.split()
    return f"{words[0]} {version.stdout.split('v=')[1].split()[0]}"
