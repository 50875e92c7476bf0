"""Abandoned loads never write into their row, however late the read completes."""

import threading

from kvtier.dataplane.abandonable import (
    AbandonableLoad,
    BounceBuffers,
    LoadState,
    load_abandonably,
)


def test_a_load_abandoned_before_its_read_returns_never_touches_the_row():
    load, row = AbandonableLoad(), bytearray(8)
    started, release = threading.Event(), threading.Event()
    outcome = []

    def slow_read(out):
        started.set()
        release.wait(10)
        out[:] = b"LATEBYTE"
        return True

    bounce = BounceBuffers(8)
    thread = threading.Thread(
        target=lambda: outcome.append(
            load_abandonably(load, slow_read, bounce.get(), memoryview(row))
        )
    )
    thread.start()
    assert started.wait(10)
    assert load.abandon()
    release.set()
    thread.join(10)
    assert outcome == [False]
    assert row == bytearray(8), "the late read wrote into a reused row"
    assert load.state is LoadState.ABANDONED


def test_a_finished_load_cannot_be_abandoned_and_holds_the_data():
    load, row = AbandonableLoad(), bytearray(4)
    bounce = BounceBuffers(4).get()

    def read(out):
        out[:] = b"good"
        return True

    assert load_abandonably(load, read, bounce, memoryview(row))
    assert row == b"good" and not load.abandon()


def test_a_load_being_copied_is_not_abandoned_yet():
    load = AbandonableLoad()
    assert load.claim()
    assert not load.abandon(), "a copy under way finishes first"
    load.finish()
    assert load.state is LoadState.DONE


def test_bounce_buffers_are_page_aligned_and_per_thread():
    buffers = BounceBuffers(10_000)
    mine = buffers.get()
    theirs = []
    t = threading.Thread(target=lambda: theirs.append(buffers.get()))
    t.start()
    t.join()
    assert mine.nbytes == 10_000
    assert buffers.get() is mine and theirs[0] is not mine
