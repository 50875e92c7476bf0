"""kvtier.policy.write_admission: a tier's stores are skipped only while no restore from it can
pay, one job a probe interval still written, and every store again after a restore verdict."""

import logging

from kvtier.policy import PolicySettings, RestorePolicy
from kvtier.policy.write_admission import RESTORE_MEMORY_S, WriteAdmission
from tests.policy.test_restore_policy import (
    BLOCK,
    GIB,
    TOKEN_BYTES,
    FakeClock,
    FakeTier,
    policy_with,
    trained_engine,
)

ROW = BLOCK * TOKEN_BYTES


def admission(policy: RestorePolicy, clock: FakeClock, max_tokens: int | None = 32768):
    return WriteAdmission(policy, "disk", max_tokens, BLOCK, ROW, clock)


def admitted(writes: WriteAdmission, clock: FakeClock, jobs: int, every_s: float) -> int:
    """How many of ``jobs`` store jobs, one each ``every_s`` seconds, are written."""
    count = 0
    for _ in range(jobs):
        count += writes.admit()
        clock.advance(every_s)
    return count


def test_a_tier_that_cannot_beat_prefill_writes_one_store_job_a_probe_interval():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(bandwidth=0.5e9)}, clock)
    writes = admission(policy, clock)
    interval = policy.settings.probe_interval_s
    # 200 jobs over 100 s: the first, then one each interval.
    assert admitted(writes, clock, 200, 0.5) == int(100 / interval)
    assert writes.skipping


def test_a_tier_that_can_pay_at_some_length_writes_every_store():
    clock = FakeClock()
    fast = admission(policy_with({"disk": FakeTier(bandwidth=8e9)}, clock), clock)
    assert admitted(fast, clock, 100, 0.5) == 100
    # 2 GB/s pays only late in long prompts: kept by an engine that takes 256k tokens.
    medium = policy_with({"disk": FakeTier(bandwidth=2e9)}, clock)
    assert admitted(admission(medium, clock, 262_144), clock, 100, 0.5) == 100
    assert admitted(admission(medium, clock, 4096), clock, 100, 0.5) < 100


def test_nothing_is_skipped_before_both_sides_are_measured_or_with_the_decision_off():
    clock = FakeClock()
    unmeasured = RestorePolicy(PolicySettings(), trained_engine(), clock)
    unmeasured.add_tier("disk")  # assumed slow until measured: writes are how it is measured
    assert admitted(admission(unmeasured, clock), clock, 50, 0.5) == 50
    off = policy_with({"disk": FakeTier(bandwidth=0.5e9)}, clock, enabled=False)
    assert admitted(admission(off, clock), clock, 50, 0.5) == 50
    slow = policy_with({"disk": FakeTier(bandwidth=0.5e9)}, clock)
    assert admitted(admission(slow, clock, max_tokens=None), clock, 50, 0.5) == 50


def test_a_restore_verdict_keeps_every_store_for_a_while():
    """Beside a queued engine a restore may pay where one alone cannot (a burst's front):
    a workload that gets such verdicts keeps its writes."""
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(bandwidth=0.5e9)}, clock)
    writes = admission(policy, clock)
    admitted(writes, clock, 10, 0.5)
    assert writes.skipping
    writes.note_restore()
    assert admitted(writes, clock, 20, RESTORE_MEMORY_S / 40) == 20
    assert not writes.skipping
    clock.advance(RESTORE_MEMORY_S)
    assert admitted(writes, clock, 20, 0.1) == 1, "then skipped again, the sample aside"


def test_a_faster_tier_ends_the_skipping(caplog):
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(bandwidth=0.5e9)}, clock)
    writes = admission(policy, clock)
    with caplog.at_level(logging.INFO, logger="kvtier.policy.write_admission"):
        admitted(writes, clock, 10, 0.5)
        # The sampled records' loads now read fast (a page cache, a quieter device).
        for nbytes in (2 << 20, 32 << 20, 256 << 20, GIB) * 4:
            policy.observe_load("disk", nbytes, FakeTier(bandwidth=20e9).seconds(nbytes))
        assert admitted(writes, clock, 10, 0.5) == 10
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, "one line when skipping starts, one when it ends"
    assert "skipping stores" in messages[0] and "32768 tokens" in messages[0]
    assert "writing every store again" in messages[1]
