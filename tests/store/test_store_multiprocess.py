"""Several processes writing into one store folder share one cap."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from pathlib import Path

from kvtier.format import HEADER_BYTES
from tests.support.crash import CAPACITY_RECORDS, open_store
from tests.support.store import PAYLOAD_BYTES, files_under, key_of, payload_of

RECORD = HEADER_BYTES + PAYLOAD_BYTES
PUTS_PER_PROCESS = 150


def hammer(root: str, offset: int, start: Barrier) -> None:
    """Put and read back records, checking the shared total after every put."""
    with open_store(root) as store:
        start.wait(60)
        for i in range(offset, offset + PUTS_PER_PROCESS):
            key = key_of(i % 40)
            store.put(key, payload_of(i % 40))
            if store.used_bytes() > CAPACITY_RECORDS * RECORD:
                raise SystemExit(f"cap exceeded: {store.used_bytes()}")
            store.refresh()
            got = store.get(key_of((i * 3) % 40))
            if got is not None and got != payload_of((i * 3) % 40):
                raise SystemExit("wrong bytes served")


def test_two_processes_never_exceed_the_shared_cap(root: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with open_store(str(root)):
        pass  # create the folder once, so both children race only on records
    start = ctx.Barrier(2)
    workers = [ctx.Process(target=hammer, args=(str(root), n * 7, start)) for n in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert [w.exitcode for w in workers] == [0, 0]
    with open_store(str(root)) as store:
        on_disk = sum(p.stat().st_size for p in files_under(store.namespace_dir / "blocks"))
        assert on_disk == store.used_bytes() <= CAPACITY_RECORDS * RECORD
        assert len(files_under(store.namespace_dir / "blocks")) == len(list(store.keys()))
        assert store.verify() == []
        for key in store.keys():  # noqa: SIM118 (a store, not a dict)
            assert store.get(key) == payload_of(int.from_bytes(key[:32], "big"))
