"""Shared-tier microbenchmark: SharedStore put/get_into against redis-py's plain SET/GET.

Side by side in one run, on the same server and the same bytes: for each topology (standalone,
3-master Cluster) and record size, every pass does, in turn,

* ``SharedStore.put`` of N payloads (header + checksum + zero-copy send),
* ``SharedStore.get_into`` of the same N keys into a preallocated buffer (GET, verify),
* ``SharedStore.get_into_when`` of them as the tier restores a block: through a per-thread
  bounce buffer, copied into the destination only after the (always granted) claim,
* redis-py's default client (hiredis installed: hiredis packer and parser) ``SET`` of the
  same N payloads, then ``GET`` of them (bytes returned, no copy, no verification);

the two sides alternate who goes first from pass to pass.

Figures are payload GB/s (1e9 bytes/s), the median of ``passes`` passes, with the range. The
1-minute load average before and after each case is kept with it: other processes on the
machine move every figure, so a result is read next to its load.
Without URLs it starts throw-away servers on loopback (kvtier.bench.redis_servers), so the
client and the servers share this machine's cores: on a small box every figure is CPU-bound.

Run: ``kvtier bench shared --out /tmp/shared-bench``.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from kvtier.bench.redis_servers import start_cluster, start_standalone
from kvtier.bench.report import environment_line, markdown_table, median, median_range
from kvtier.dataplane.abandonable import BounceBuffers
from kvtier.format import Namespace
from kvtier.store.base import FixedClaim
from kvtier.store.shared import SharedStore, parse_url
from kvtier.store.shared.startup import release_of

MIB = 2**20
#: Record payload sizes measured by default: a large-model block and a small one.
DEFAULT_SIZES = (int(5.6 * MIB), MIB // 2)
#: Payload bytes moved per operation kind per pass (at least 4 records).
BYTES_PER_PASS = 96 * MIB


def bench_namespace(block_bytes: int) -> Namespace:
    """A namespace of its own for one bench run's records of ``block_bytes``."""
    return Namespace(
        model=f"bench/shared/{uuid.uuid4().hex}",
        weights_fingerprint="",
        kv_dtype="bfloat16",
        block_size_tokens=16,
        num_groups=1,
        num_layers=1,
        num_kv_heads=1,
        head_size=1,
        block_bytes=block_bytes,
        hash_algorithm="sha256_cbor",
    )


def plain_client(url: str) -> redis.Redis | RedisCluster:
    """redis-py's default client (hiredis parser when installed) on the URL's first host."""
    server = parse_url(url)
    host, port = server.hosts[0]
    if server.cluster:
        return RedisCluster(host=host, port=port, require_full_coverage=False)
    return redis.Redis(host=host, port=port)


def server_release(url: str) -> str:
    """The server's product and release from its ``INFO``: "Redis 7.0.15", "Valkey 9.1.2"."""
    client = redis.Redis(*parse_url(url).hosts[0])  # one node speaks for a Cluster
    try:
        return " ".join(release_of(client.info("server")))
    finally:
        client.close()


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def measure(url: str, payload_len: int, passes: int) -> dict[str, Any]:
    """All four operations on one server and size; returns GB/s lists and medians."""
    count = max(4, BYTES_PER_PASS // payload_len)
    payload = memoryview(bytearray(os.urandom(payload_len)))
    out = memoryview(bytearray(payload_len))
    bounce = BounceBuffers(payload_len).get()
    options = {"url": url, "op_timeout_s": 10.0}
    store = SharedStore.from_options(options, bench_namespace(payload_len))
    plain = plain_client(url)
    keys = [i.to_bytes(32, "big") + bytes(4) for i in range(count)]
    plain_keys = [b"bench:plain:" + k.hex().encode() for k in keys]
    runs: dict[str, list[float]] = {
        "put": [],
        "get_into": [],
        "restore": [],
        "plain_set": [],
        "plain_get": [],
    }
    total = count * payload_len
    failures = 0

    def put_all() -> int:
        return sum(not store.put(k, payload) for k in keys)

    def get_all() -> int:
        return sum(not store.get_into(k, out) for k in keys)

    def restore_all() -> int:
        return sum(not store.get_into_when(k, out, FixedClaim(), bounce) for k in keys)

    def plain_set_all() -> None:
        for k in plain_keys:
            plain.set(k, payload)

    def plain_get_all() -> None:
        for k in plain_keys:
            plain.get(k)  # dropped at once, as get_into drops the client's bytes

    load_before = os.getloadavg()[0]
    try:
        theirs = (("plain_set", plain_set_all), ("plain_get", plain_get_all))
        for n in range(passes):
            # Alternate who goes first, so drift in the machine's load hits both sides alike;
            # the two reads of ours swap too (the first read after the puts runs colder).
            reads = (("get_into", get_all), ("restore", restore_all))
            ours = (("put", put_all), *(reads if n % 4 < 2 else reads[::-1]))
            for name, fn in (*ours, *theirs) if n % 2 == 0 else (*theirs, *ours):
                start = time.perf_counter()
                failures += fn() or 0
                runs[name].append(_gbps(total, time.perf_counter() - start))
            for k in keys:  # keep the server's memory flat between passes
                store.delete(k)
            for k in plain_keys:
                plain.delete(k)
        if bytes(out) != bytes(payload):
            raise RuntimeError("get_into delivered different bytes than were put")
    finally:
        store.close()
        plain.close()
    medians = {name: median(values) for name, values in runs.items()}
    return {
        "payload_bytes": payload_len,
        "records_per_pass": count,
        "passes": passes,
        "failed_ops": failures,
        "gbps": runs,
        "median_gbps": medians,
        "ratio_get_into_vs_plain_get": medians["get_into"] / medians["plain_get"],
        "ratio_restore_vs_plain_get": medians["restore"] / medians["plain_get"],
        "ratio_put_vs_plain_set": medians["put"] / medians["plain_set"],
        "load_average_1min": [load_before, os.getloadavg()[0]],
    }


def _versions(url: str) -> dict[str, str]:
    import hiredis

    return {
        "redis-py": redis.__version__,
        "hiredis": hiredis.__version__,
        "server": server_release(url),
    }


def run(
    out_dir: Path,
    standalone_url: str | None = None,
    cluster_url: str | None = None,
    sizes: Sequence[int] = DEFAULT_SIZES,
    passes: int = 5,
) -> dict[str, Any]:
    """Measure both topologies (starting throw-away servers for URLs not given); write
    ``shared.json`` and ``shared.md`` under ``out_dir`` and return the results."""
    out_dir.mkdir(parents=True, exist_ok=True)
    started: list[Callable[[], None]] = []
    results: dict[str, Any] = {"environment": environment_line(), "versions": {}, "rows": []}
    try:
        with tempfile.TemporaryDirectory(prefix="kvtier-shared-bench-") as tmp:
            if standalone_url is None:
                server = start_standalone(Path(tmp) / "standalone", maxmemory_bytes=1024 * MIB)
                started.append(server.kill)
                standalone_url = server.url
            if cluster_url is None:
                cluster = start_cluster(Path(tmp) / "cluster", maxmemory_bytes=512 * MIB)
                started.append(cluster.stop)
                cluster_url = cluster.url
            results["versions"] = _versions(standalone_url)
            for topology, url in (("standalone", standalone_url), ("cluster", cluster_url)):
                for size in sizes:
                    row = measure(url, size, passes)
                    row["topology"] = topology
                    results["rows"].append(row)
    finally:
        for stop in started:
            stop()
    (out_dir / "shared.json").write_text(json.dumps(results, indent=2))
    (out_dir / "shared.md").write_text(report(results) + "\n")
    return results


def report(results: dict[str, Any]) -> str:
    """A markdown table of the medians (with ranges) and the two ratios."""
    rows = []
    for row in results["rows"]:
        runs = row["gbps"]
        rows.append(
            [
                f"{row['topology']} {row['payload_bytes'] / MIB:.1f} MiB "
                f"x{row['records_per_pass']}",
                median_range(runs["put"]),
                median_range(runs["plain_set"]),
                f"{row['ratio_put_vs_plain_set']:.2f}",
                median_range(runs["get_into"]),
                median_range(runs["plain_get"]),
                f"{row['ratio_get_into_vs_plain_get']:.2f}",
                median_range(runs["restore"]),
                f"{row['ratio_restore_vs_plain_get']:.2f}",
                "{:.1f}, {:.1f}".format(*row["load_average_1min"]),
            ]
        )
    header = [
        "server, record",
        "put GB/s",
        "plain SET GB/s",
        "put/SET",
        "get_into GB/s",
        "plain GET GB/s",
        "get_into/GET",
        "restore GB/s",
        "restore/GET",
        "load before, after",
    ]
    return (
        markdown_table(header, rows)
        + f"\n\nMedian (min-max) of {results['rows'][0]['passes']} passes. "
        + ", ".join(f"{k} {v}" for k, v in results["versions"].items())
        + "; "
        + results["environment"]
    )
