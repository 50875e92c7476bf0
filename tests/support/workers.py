"""Programs that fault-suite child processes run (imported by the forkserver, never by pytest).

A writer loops over random puts, loads, deletes and refreshes on a shared store until it is
SIGKILLed. It checks every payload it loads and exits with ``WRONG_DATA_EXIT`` if one is not a
whole payload written for its key, so the parent can tell "killed" from "served wrong bytes".
"""

from __future__ import annotations

import mmap
import os
import random
import sys

from tests.support.faults import (
    FUZZ_KEYS,
    FUZZ_PAYLOAD,
    fuzz_key,
    fuzz_payload,
    open_fuzz_store,
    payload_ok,
)

WRONG_DATA_EXIT = 23
OPEN_FAILED_EXIT = 24


def write_forever(root: str, seed: int) -> None:
    """Random store operations until killed (exits only if it saw wrong data)."""
    rng = random.Random(seed)
    try:
        store = open_fuzz_store(root)
    except Exception:  # reported to the parent through the exit code
        import traceback

        traceback.print_exc()
        os._exit(OPEN_FAILED_EXIT)
    aligned = memoryview(mmap.mmap(-1, FUZZ_PAYLOAD))
    plain = memoryview(bytearray(FUZZ_PAYLOAD))
    while True:
        i = rng.randrange(FUZZ_KEYS)
        op = rng.random()
        if op < 0.55:
            payload = fuzz_payload(i, rng.getrandbits(48))
            if rng.random() < 0.7:  # page-aligned source: the O_DIRECT write path
                aligned[:] = payload
                store.put(fuzz_key(i), aligned)
            else:
                store.put(fuzz_key(i), payload)
        elif op < 0.85:
            out = aligned if rng.random() < 0.7 else plain
            if store.get_into(fuzz_key(i), out) and not payload_ok(i, out):
                print(f"wrong bytes served for key {i}", file=sys.stderr)
                os._exit(WRONG_DATA_EXIT)
        elif op < 0.95:
            store.delete(fuzz_key(i))
        else:
            store.refresh()


def open_and_crash_in_reclaim(root: str) -> None:
    """Open the crash tests' store with an I/O object that dies at its first record unlink.

    Opening reclaims what dead writers left; the first record file it unlinks is the crash.
    """
    from tests.support.crash import CrashingWriter, open_store

    open_store(root, CrashingWriter("before_evict_unlink"))
    raise SystemExit("opened without unlinking any record file")


def perm_key(i: int) -> bytes:
    """Keys in distinct fan-out folders (first byte 0x10 * (i + 1))."""
    return bytes([0x10 * (i + 1)]) + i.to_bytes(31, "big") + (0).to_bytes(4, "big")


#: Roles of the keys in the permission scenario, by index.
UNREADABLE, LOCKED, FOREIGN, SHARED, NEW_IN_LOCKED, BLOCKED = range(6)


def new_in_locked_key() -> bytes:
    """A key whose record would go into LOCKED's fan-out folder."""
    return perm_key(LOCKED)[:1] + b"\xee" * 31 + (0).to_bytes(4, "big")


def permission_scenario(root: str) -> None:
    """Run store operations under permission denials; print the outcomes as JSON.

    Meant to run without CAP_DAC_OVERRIDE/CAP_DAC_READ_SEARCH/CAP_FOWNER (``setpriv``), so
    file modes apply even to uid 0. The parent set the modes of the record files and of the
    LOCKED fan-out folder beforehand; the ``tmp`` folder is locked here, once the store is open.
    """
    import json
    from pathlib import Path

    outcomes: dict[str, object] = {}
    with open_fuzz_store(root) as store:
        for role, name in [
            (UNREADABLE, "unreadable"),
            (LOCKED, "locked"),
            (FOREIGN, "foreign"),
            (SHARED, "shared"),
        ]:
            data = store.get(perm_key(role))
            outcomes[f"get_{name}"] = None if data is None else payload_ok(role, data)
        outcomes["put_into_locked_folder"] = store.put(
            new_in_locked_key(), fuzz_payload(NEW_IN_LOCKED, 1)
        )
        outcomes["delete_from_locked_folder"] = store.delete(perm_key(LOCKED))
        tmp = Path(store.namespace_dir) / "tmp"
        os.chmod(tmp, 0)
        try:
            outcomes["put_with_locked_tmp"] = store.put(perm_key(BLOCKED), fuzz_payload(BLOCKED, 1))
        finally:
            os.chmod(tmp, 0o700)
        outcomes["temps_left"] = len(os.listdir(tmp))
        outcomes["corrupt"] = store.stats().corrupt
    print(json.dumps(outcomes))


def open_close_loop(root: str, rounds: int) -> None:
    """Open and close the store ``rounds`` times; exit OPEN_FAILED_EXIT if an open fails."""
    import traceback

    for _ in range(rounds):
        try:
            open_fuzz_store(root).close()
        except Exception:
            traceback.print_exc()
            os._exit(OPEN_FAILED_EXIT)


def put_forever(
    root: str, seed: int, threads: int, capacity: int, crash_at: str, batch: int = 1
) -> None:
    """``threads`` threads put fresh records into their own namespace under ``root`` (one per
    ``seed``) with cap ``capacity`` until killed, so every put evicts; ``batch`` records at a
    time with ``put_many`` when more than one. ``crash_at`` (a ``CrashingWriter`` step, or "")
    makes the process die at that step after a while instead."""
    import threading

    from kvtier.store import DiskStore, RecordIO
    from tests.support.crash import CrashingWriter
    from tests.support.store import make_namespace

    writer = CrashingWriter(crash_at or "never")
    writer.armed = False
    try:
        store = DiskStore(
            root,
            make_namespace(model=f"footprint/{seed}", block_bytes=FUZZ_PAYLOAD),
            capacity,
            free_space_floor_bytes=0,
            io=RecordIO(writer),
        )
    except Exception:
        import traceback

        traceback.print_exc()
        os._exit(OPEN_FAILED_EXIT)

    def loop(thread: int) -> None:
        rng = random.Random(seed * 1000 + thread)
        payloads = [memoryview(mmap.mmap(-1, FUZZ_PAYLOAD)) for _ in range(batch)]
        for n in range(1 << 62):
            numbers = [rng.randrange(1 << 30) for _ in range(batch)]
            for i, payload in zip(numbers, payloads, strict=True):
                payload[:8] = i.to_bytes(8, "big")
            if batch == 1:
                store.put(fuzz_key(numbers[0]), payloads[0])
            else:
                store.put_many([fuzz_key(i) for i in numbers], payloads)
            if n % 16 == 0:
                store.refresh()
            if crash_at and n == 8:
                writer.armed = True

    for thread in range(threads):
        threading.Thread(target=loop, args=(thread,), daemon=True).start()
    threading.Event().wait()


def open_with_cap(root: str, model: str, capacity: int, puts: int) -> None:
    """Open a store of namespace ``model`` on ``root`` with ``capacity`` (a cap to set for the
    folder), put ``puts`` records of FUZZ_PAYLOAD and print the store's cap."""
    from kvtier.store import DiskStore
    from tests.support.store import make_namespace

    with DiskStore(
        root, make_namespace(model=model, block_bytes=FUZZ_PAYLOAD), capacity, 0
    ) as store:
        for i in range(puts):
            store.put(fuzz_key(1000 + i), fuzz_payload(1000 + i, 1))
        print(store.capacity_bytes)
