"""Access times: noted by loads, written to the index by a thread of their own.

Writing them from the loading thread made one block's load in 256 wait for 11 index
transactions, 3.2 s with a busy Python thread beside the readers (kvtier.store.disk.
access_times). Here: the writer runs on its own thread, a load never waits for the index's
access-time write, and what is written still orders eviction.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from kvtier.store import DiskStore
from kvtier.store.disk import store as disk_store
from kvtier.store.disk.access_times import AccessTimes
from tests.support.store import key_of
from tests.support.store import payload_of as payload

OpenDisk = Callable[..., DiskStore]


def test_a_full_batch_is_written_by_the_writer_thread_and_close_writes_the_rest() -> None:
    written: list[tuple[str, dict[bytes, int]]] = []
    done = threading.Event()

    def write(batch: dict[bytes, int]) -> None:
        written.append((threading.current_thread().name, batch))
        done.set()

    times = AccessTimes(write, batch=3, name="atime-test")
    times.note(b"a")
    times.note(b"b")
    assert written == []  # not a full batch yet
    times.note(b"c")
    assert done.wait(10), "the writer thread never wrote the full batch"
    ((thread, batch),) = written
    assert thread == "atime-test" and sorted(batch) == [b"a", b"b", b"c"]
    times.note(b"d")
    times.close()
    assert written[-1][0] == threading.current_thread().name
    assert list(written[-1][1]) == [b"d"]
    assert times.take() == {}


def test_take_hands_out_the_oldest_first_up_to_its_limit() -> None:
    times = AccessTimes(lambda batch: None, batch=100, name="atime-test")
    for key in (b"a", b"b", b"c"):
        times.note(key)
    assert list(times.take(2)) == [b"a", b"b"]
    assert list(times.take()) == [b"c"]
    times.close()


def test_loads_never_wait_for_the_access_time_write(open_disk: OpenDisk, monkeypatch) -> None:
    """Regression: the 256th hit wrote the batch on the loading thread, so a slow index write
    (the GIL handed back at every SQLite step) stalled that load."""
    monkeypatch.setattr(disk_store, "TOUCH_BATCH", 4)
    store = open_disk(records=8)
    for i in range(4):
        assert store.put(key_of(i), payload(i))
    release = threading.Event()
    entered = threading.Event()
    original = store._index.touch

    def stuck_touch(touches: dict[bytes, int]) -> None:
        entered.set()
        release.wait(60)
        original(touches)

    monkeypatch.setattr(store._index, "touch", stuck_touch)
    loads_done = threading.Event()

    def load_all() -> None:
        for _ in range(3):
            for i in range(4):
                assert store.get(key_of(i)) == payload(i)
        loads_done.set()

    loader = threading.Thread(target=load_all)
    loader.start()
    try:
        assert entered.wait(30), "the batch was never written"
        assert loads_done.wait(30), "loads waited for the index's access-time write"
    finally:
        release.set()
        loader.join(30)


def test_written_access_times_order_eviction(open_disk: OpenDisk, monkeypatch) -> None:
    """Loaded records outlive unloaded ones, through the writer thread and the batch's one
    UPDATE statement."""
    monkeypatch.setattr(disk_store, "TOUCH_BATCH", 2)
    store = open_disk(records=4)
    for i in range(4):
        assert store.put(key_of(i), payload(i))
    assert store.get(key_of(0)) == payload(0)
    assert store.get(key_of(2)) == payload(2)  # a full batch: the writer thread writes it
    store._access.close()  # wait for the writer; the batch is in the index now
    assert store.put(key_of(4), payload(4))
    assert store.put(key_of(5), payload(5))
    assert store.contains(key_of(0)) and store.contains(key_of(2))
    assert not store.contains(key_of(1)) and not store.contains(key_of(3))
