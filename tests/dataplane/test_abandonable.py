"""Abandoned loads never write into their row, however late the read completes."""

import threading

import pytest

from kvtier.dataplane import abandonable
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


@pytest.fixture(params=["native", "python"])
def claim_ops(request, monkeypatch):
    """Both ways a load's claim cell moves: the native compare-and-swap (what the disk tier's
    reader uses) and the lock where the reader is not built."""
    if request.param == "native":
        if abandonable._CLAIM_OPS is None:
            pytest.skip("kvtier.native._recordread is not built")
    else:
        monkeypatch.setattr(abandonable, "_CLAIM_OPS", None)
    return request.param


def test_each_transition_happens_once_and_only_from_its_state(claim_ops):
    load = AbandonableLoad()
    assert load.state is LoadState.PENDING
    assert load(), "calling a load claims it: a store takes it as its claim"
    assert load.state is LoadState.COPYING
    assert not load.claim() and not load.abandon()
    load.finish()
    assert load.state is LoadState.DONE
    assert not load.claim() and not load.abandon()

    abandoned = AbandonableLoad()
    assert abandoned.abandon() and abandoned.abandon(), "abandoning twice still says abandoned"
    assert not abandoned.claim() and abandoned.state is LoadState.ABANDONED
    abandoned.finish()
    assert abandoned.state is LoadState.ABANDONED, "finish moves only a load being copied"


def test_a_claim_and_an_abandon_racing_settle_on_exactly_one(claim_ops):
    for _ in range(200):
        load = AbandonableLoad()
        start = threading.Barrier(2)
        outcomes = {}

        def claimer(load=load, start=start, outcomes=outcomes):
            start.wait()
            outcomes["claimed"] = load.claim()

        thread = threading.Thread(target=claimer)
        thread.start()
        start.wait()
        outcomes["abandoned"] = load.abandon()
        thread.join(10)
        assert outcomes["claimed"] != outcomes["abandoned"]
        assert load.state is (LoadState.COPYING if outcomes["claimed"] else LoadState.ABANDONED)


def test_a_released_claim_is_pending_again_and_release_moves_nothing_else(claim_ops):
    load = AbandonableLoad()
    load.release()
    assert load.state is LoadState.PENDING, "nothing to give back"
    assert load.claim()
    load.release()  # its read failed: another source may claim the row
    assert load.state is LoadState.PENDING
    assert load.abandon(), "a released load can be abandoned again"
    load.release()
    assert load.state is LoadState.ABANDONED
    done = AbandonableLoad()
    assert done.claim()
    done.finish()
    done.release()
    assert done.state is LoadState.DONE
