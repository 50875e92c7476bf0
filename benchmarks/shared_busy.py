"""The shared tier's reads beside a busy Python thread: a thread's share in one exchange, a
GET per record with the value received natively, and a GET per record with a ``recv_into`` loop.

An engine's scheduler loop runs Python without pause while a request waits for its restore, so
every time one of kvtier's I/O threads gives the GIL up (a socket call, a checksum, a copy) it
may wait out the interpreter's switch interval (5 ms) to get it back. This measures what that
costs a load's share of records, read as the tier reads it (``get_many_into_when`` into rows,
each under an ``AbandonableLoad``'s claim), side by side in one run on one throw-away loopback
server, quiet and with a spinning Python thread beside the reader, rounds alternating:

* ``exchange``: the share's GETs sent, received, hashed, claimed and copied in one GIL-free
  call (``kvtier.store.shared.batch``), as the store does where it can;
* ``get each, native``: a GET per record (``get_into_when``), the value received in one native
  call: the store's path where no exchange can run;
* ``get each, python``: the same with the Python ``recv_into`` loop (no native module).

Figures: milliseconds per record and payload GB/s, medians of the passes of every round.

Run: ``python -m benchmarks shared-busy --out bench-out``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks import busy_thread
from kvtier import native
from kvtier.bench.redis_servers import start_standalone
from kvtier.bench.report import environment_line, markdown_table
from kvtier.bench.shared_bench import bench_namespace, server_release
from kvtier.dataplane.abandonable import AbandonableLoad
from kvtier.store.shared import SharedStore
from kvtier.store.shared.startup import FALLBACK_MAX_RECORD_BYTES

MIB = 2**20
RECORDS = 16


#: The read paths, in the order they run in each round.
PATHS = ("exchange", "get each, native", "get each, python")


def _path(name: str) -> Any:
    """The patches that make the store read the way ``name`` says."""
    receiver, exchanger = native.socket_receiver(), native.socket_exchanger()
    if receiver is None or exchanger is None:
        raise SystemExit("kvtier.native._sockread is not built: run scripts/setup.sh")
    stack = contextlib.ExitStack()
    if name != "exchange":
        stack.enter_context(mock.patch.object(native, "socket_exchanger", lambda: None))
    if name == "get each, python":
        stack.enter_context(mock.patch.object(native, "socket_receiver", lambda: None))
    return stack


def measure(
    store: SharedStore, size: int, passes: int, rounds: int, report: Callable[[str], None]
) -> dict[str, list[float]]:
    """Seconds per record of each (path, thread) case, every pass of every round."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    keys = [i.to_bytes(8, "big") * 4 for i in range(RECORDS)]
    for key in keys:
        if not store.put(key, payload):
            raise SystemExit(f"the server refused a record of {size} bytes")
    rows = [memoryview(bytearray(size)) for _ in keys]
    bounce = memoryview(bytearray(size))
    seconds: dict[str, list[float]] = {}
    for _ in range(rounds):
        for name in PATHS:
            for busy in (False, True):
                case = f"{name}, {'busy' if busy else 'quiet'}"
                with _path(name), busy_thread.spinning(busy):
                    for _ in range(passes):
                        loads = [AbandonableLoad() for _ in keys]
                        started = time.perf_counter()
                        loaded = store.get_many_into_when(keys, rows, loads, bounce)
                        seconds.setdefault(case, []).append(
                            (time.perf_counter() - started) / RECORDS
                        )
                        if not all(loaded):
                            raise SystemExit(f"a read of {size} bytes missed")
                if any(row.tobytes() != payload for row in rows):
                    raise SystemExit("a read returned other bytes")
        report(f"{size} bytes: round done")
    exchanged = store.stats().batched_hits
    if exchanged != rounds * 2 * passes * RECORDS:
        raise SystemExit(f"the exchange case read {exchanged} records by exchange, not all")
    return seconds


def run(
    out: Path,
    sizes: Sequence[int],
    passes: int,
    rounds: int,
    report: Callable[[str], None],
    url: str | None = None,
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {"environment": environment_line(), "rows": []}
    with tempfile.TemporaryDirectory(prefix="kvtier-shared-busy-") as tmp:
        server = None
        if url is None:
            server = start_standalone(Path(tmp) / "server", maxmemory_bytes=1024 * MIB)
            url = server.url
        try:
            results["server"] = server_release(url)
            for size in sizes:
                cap = max(size * 2, FALLBACK_MAX_RECORD_BYTES)
                options = {"url": url, "max_record_bytes": cap}
                store = SharedStore.from_options(options, bench_namespace(size))
                try:
                    seconds = measure(store, size, passes, rounds, report)
                finally:
                    store.close()
                results["rows"].append({"payload_bytes": size, "seconds_per_record": seconds})
        finally:
            if server is not None:
                server.kill()
    rows = []
    for row in results["rows"]:
        size, seconds = row["payload_bytes"], row["seconds_per_record"]
        for case, runs in seconds.items():
            median = statistics.median(runs)
            gbps = size / median / 1e9  # small records: well under 0.1
            rows.append([f"{size / MIB:.2f} MiB", case, f"{median * 1e3:.2f}", f"{gbps:.3f}"])
    table = markdown_table(["record", "read path, beside", "ms per record", "GB/s"], rows)
    markdown = (
        f"{table}\n\nMedians of {passes} passes x {rounds} rounds of {RECORDS} records each, "
        f"one reader thread; server {results['server']}; {results['environment']}"
    )
    (out / "shared-busy.json").write_text(json.dumps(results, indent=2))
    (out / "shared-busy.md").write_text(markdown + "\n")
    return results
