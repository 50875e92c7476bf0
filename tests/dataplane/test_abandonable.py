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
    assert load.claim(), "a store claims it through the LoadClaim protocol"
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


def test_a_written_load_can_be_finished_abandoned_or_given_back(claim_ops):
    """WRITTEN: claimed, and the row will not change any more. The scheduler may abandon it
    (its thread is still loading other blocks), which it may not while copying."""
    load = AbandonableLoad()
    assert load.claim()
    load.written()
    assert load.state is LoadState.WRITTEN and not load.abandoned
    load.finish()
    assert load.state is LoadState.DONE
    load.written()
    assert load.state is LoadState.DONE, "written moves only a load being copied"

    late = AbandonableLoad()
    assert late.claim()
    assert not late.abandon(), "copying: ask again later"
    late.written()
    assert late.abandon() and late.abandoned
    late.finish()
    late.release()
    assert late.state is LoadState.ABANDONED, "an abandoned load stays abandoned"

    failed = AbandonableLoad()
    assert failed.claim()
    failed.written()
    failed.release()  # its check failed: another source may claim the row
    assert failed.state is LoadState.PENDING and failed.claim()


@pytest.mark.skipif(abandonable._CLAIM_OPS is None, reason="kvtier.native._recordread is not built")
def test_the_native_reader_leaves_its_load_written(tmp_path):
    """The reader moves the claim on once it stops writing the row."""
    from kvtier.format import HEADER_BYTES
    from kvtier.native import claiming_reader
    from tests.support.store import aligned_buffer

    path = tmp_path / "record"
    path.write_bytes(bytes(HEADER_BYTES) + b"x" * 8192)
    path.chmod(0o600)
    header, bounce, out = (aligned_buffer(n) for n in (HEADER_BYTES, 8192, 8192))
    load = AbandonableLoad()
    read = claiming_reader()
    assert read is not None
    into, status, *_ = read(str(path).encode(), header, bounce, out, load.native_cell, False, True)
    assert status == 0 and into in (1, 3)
    assert bytes(out) == b"x" * 8192
    assert load.state is LoadState.WRITTEN
