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
* ``exchange, native lock`` and ``exchange, one at a time``: the same with the readers taking
  the server one at a time (a single-threaded server interleaves the replies of connections
  served at once), by a lock taken inside the native call without the GIL, and by a Python
  lock around each exchange;
* ``get each, native``: a GET per record (``get_into_when``), the value received in one native
  call: the store's path where no exchange can run;
* ``get each, python``: the same with the Python ``recv_into`` loop (no native module).

With ``--threads 1,4`` the records are read by one thread, then shared out over four as the
tier shares a load's blocks; ``--spinning-processes N`` keeps N processes spinning throughout,
standing in for an engine's other busy processes (its worker, its API server) on a machine
with few cores; ``--windows 4194304,16777216`` runs the exchange once per window (the bytes of
values it keeps asked for and not received; default: the store's). Figures: milliseconds per
record and payload GB/s, medians of the passes of every round.

Run: ``python -m benchmarks shared-busy --out bench-out``.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import tempfile
import threading
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
from kvtier.store.shared import SharedStore, batch
from kvtier.store.shared.startup import FALLBACK_MAX_RECORD_BYTES

MIB = 2**20
RECORDS = 16


#: The read paths besides the exchange, in the order they run in each round after it.
GET_PATHS = ("get each, native", "get each, python")
#: The exchange with the readers' exchanges taken one at a time: by the store's own lock,
#: taken inside the native call without the GIL (``batch.ONE_AT_A_TIME``), and by a Python
#: lock around each, to see whether a single-threaded server serves one connection at a time
#: faster than several.
NATIVE_LOCK = "exchange, native lock"
ONE_AT_A_TIME = "exchange, one at a time"


def _paths(windows: Sequence[int]) -> list[str]:
    """The read paths of a round: the exchange with each window (bytes in flight), the
    exchange one at a time, then the GET per record."""
    if not windows:
        return ["exchange", NATIVE_LOCK, ONE_AT_A_TIME, *GET_PATHS]
    windowed = (f"exchange, window {w / MIB:g} MiB" for w in windows)
    return [*windowed, NATIVE_LOCK, ONE_AT_A_TIME, *GET_PATHS]


def _one_at_a_time(exchange: Callable[..., Any]) -> Callable[..., Any]:
    lock = threading.Lock()

    def locked(*args: Any, **kwargs: Any) -> Any:
        with lock:
            return exchange(*args, **kwargs)

    return locked


def _path(name: str) -> Any:
    """The patches that make the store read the way ``name`` says."""
    receiver, exchanger = native.socket_receiver(), native.socket_exchanger()
    if receiver is None or exchanger is None:
        raise SystemExit("kvtier.native._sockread is not built: run scripts/setup.sh")
    stack = contextlib.ExitStack()
    if name.startswith("exchange, window "):
        window = round(float(name.removeprefix("exchange, window ").split()[0]) * MIB)
        stack.enter_context(mock.patch.object(batch, "WINDOW_BYTES", window))
    if name == ONE_AT_A_TIME:
        stack.enter_context(mock.patch.object(batch, "exchange", _one_at_a_time(batch.exchange)))
    if name == NATIVE_LOCK:
        stack.enter_context(mock.patch.object(batch, "ONE_AT_A_TIME", True))
    if name.startswith("get each"):
        stack.enter_context(mock.patch.object(native, "socket_exchanger", lambda: None))
    if name == "get each, python":
        stack.enter_context(mock.patch.object(native, "socket_receiver", lambda: None))
    return stack


def measure(
    store: SharedStore,
    size: int,
    passes: int,
    rounds: int,
    report: Callable[[str], None],
    threads: Sequence[int] = (1,),
    windows: Sequence[int] = (),
) -> dict[str, list[float]]:
    """Seconds per record of each (path, thread, reader threads) case, every pass of every
    round. With ``n`` reader threads each reads every ``n``-th record, as the tier shares a
    load's blocks out."""
    payload = bytes(range(256)) * (size // 256) + bytes(size % 256)
    keys = [i.to_bytes(8, "big") * 4 for i in range(RECORDS)]
    for key in keys:
        if not store.put(key, payload):
            raise SystemExit(f"the server refused a record of {size} bytes")
    rows = [memoryview(bytearray(size)) for _ in keys]
    bounces = [memoryview(bytearray(size)) for _ in range(max(threads))]
    seconds: dict[str, list[float]] = {}
    for _ in range(rounds):
        for readers in threads:
            for name in _paths(windows):
                for busy in (False, True):
                    case = f"{name}, {readers} thread(s), {'busy' if busy else 'quiet'}"
                    with _path(name), busy_thread.spinning(busy):
                        for _ in range(passes):
                            took = _read_shares(store, keys, rows, bounces[:readers])
                            seconds.setdefault(case, []).append(took / RECORDS)
                    if any(row.tobytes() != payload for row in rows):
                        raise SystemExit("a read returned other bytes")
        report(f"{size} bytes: round done")
    exchanged = store.stats().batched_hits
    exchanges = sum(name.startswith("exchange") for name in _paths(windows))
    if exchanged != rounds * len(threads) * exchanges * 2 * passes * RECORDS:
        raise SystemExit(f"the exchange case read {exchanged} records by exchange, not all")
    return seconds


def _read_shares(
    store: SharedStore, keys: list[bytes], rows: list[memoryview], bounces: list[memoryview]
) -> float:
    """Seconds for ``len(bounces)`` threads to read every record, thread ``t`` the records
    ``t, t + n, ...`` in one ``get_many_into_when``."""
    readers = len(bounces)
    missed: list[int] = []

    def read(t: int) -> None:
        share = list(range(t, len(keys), readers))
        loads = [AbandonableLoad() for _ in share]
        loaded = store.get_many_into_when(
            [keys[i] for i in share], [rows[i] for i in share], loads, bounces[t]
        )
        missed.extend(i for i, ok in zip(share, loaded, strict=True) if not ok)

    workers = [threading.Thread(target=read, args=(t,)) for t in range(readers)]
    started = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    took = time.perf_counter() - started
    if missed:
        raise SystemExit(f"{len(missed)} reads missed")
    return took


def run(
    out: Path,
    sizes: Sequence[int],
    passes: int,
    rounds: int,
    report: Callable[[str], None],
    url: str | None = None,
    threads: Sequence[int] = (1,),
    spinning_processes: int = 0,
    windows: Sequence[int] = (),
) -> dict[str, Any]:
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "environment": environment_line(),
        "spinning_processes": spinning_processes,
        "rows": [],
    }
    with (
        tempfile.TemporaryDirectory(prefix="kvtier-shared-busy-") as tmp,
        busy_thread.spinning_processes(spinning_processes),
    ):
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
                    seconds = measure(store, size, passes, rounds, report, threads, windows)
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
        f"{table}\n\nMedians of {passes} passes x {rounds} rounds of {RECORDS} records each; "
        f"{spinning_processes} spinning processes beside; server {results['server']}; "
        f"{results['environment']}"
    )
    (out / "shared-busy.json").write_text(json.dumps(results, indent=2))
    (out / "shared-busy.md").write_text(markdown + "\n")
    return results
