"""Requests in flight: the decision weighs the engine's and the tiers' queues of decided work.

Fake clock, fake tiers and a simulated engine: the engine prefills one request after another
and the tier loads one after another (what one GPU and one disk do with long prompts), so the
time at which every request has its KV can be computed exactly for any set of verdicts.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.policy import BatchHit, DeadlineRule, PolicySettings, RestorePolicy
from kvtier.policy.backlog import ENGINE, Backlog
from tests.policy.test_restore_policy import (
    TOKEN_BYTES,
    FakeClock,
    FakeTier,
    policy_with,
    run_load,
    truth_recompute_s,
)
from tests.support.policy import engine_wait_s, overdue, predict_restore_s

#: A disk at 2.5 GB/s: 8k tokens of an 8B model (1 GiB) take ~0.43 s, their prefill ~0.22 s.
SLOW_DISK = FakeTier(bandwidth=2.5e9, latency_s=0.002)
#: A disk at 1 GB/s: ~1.07 s for the same, five times their prefill.
SLOWER_DISK = FakeTier(bandwidth=1e9, latency_s=0.002)


def test_a_backlog_queues_charges_and_drains_with_time():
    backlog = Backlog()
    assert backlog.wait_s(ENGINE, 10.0) == 0.0
    backlog.charge(ENGINE, 2.0, 10.0)
    backlog.charge(ENGINE, 1.0, 10.5)  # queued after the first: busy until 13.0
    assert backlog.wait_s(ENGINE, 10.5) == pytest.approx(2.5)
    assert backlog.wait_s(ENGINE, 12.0) == pytest.approx(1.0)
    assert backlog.wait_s(ENGINE, 20.0) == 0.0
    backlog.charge(ENGINE, 1.0, 20.0)  # an idle resource starts the work now, not at 13.0
    assert backlog.wait_s(ENGINE, 20.0) == pytest.approx(1.0)
    backlog.charge("disk", 0.0, 20.0)
    backlog.charge("disk", -1.0, 20.0)
    assert backlog.wait_s("disk", 20.0) == 0.0


@given(
    cached=st.integers(0, 32_000),
    tokens=st.integers(16, 64_000),
    bandwidth=st.floats(1e8, 1e11),
)
@settings(max_examples=150, deadline=None)
def test_with_nothing_queued_the_verdict_is_the_one_for_the_request_alone(
    cached, tokens, bandwidth
):
    policy = policy_with({"disk": FakeTier(bandwidth)})
    queued = policy.decide("disk", cached, tokens, tokens * TOKEN_BYTES)
    alone = policy.decide("disk", cached, tokens, tokens * TOKEN_BYTES, queued=False)
    assert queued.restore_tokens == alone.restore_tokens
    assert queued.engine_wait_s == 0.0


@given(
    cached=st.integers(0, 32_000),
    tokens=st.integers(16, 64_000),
    bandwidth=st.floats(1e8, 1e11),
    engine_queue_s=st.floats(0.0, 30.0),
)
@settings(max_examples=150, deadline=None)
def test_a_queue_on_the_engine_never_turns_a_paying_restore_into_a_recompute(
    cached, tokens, bandwidth, engine_queue_s
):
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(bandwidth)}, clock)
    alone = policy.decide("disk", cached, tokens, tokens * TOKEN_BYTES, queued=False)
    queue = policy.decide("disk", 0, 4096, 1 << 40)  # a recompute verdict of some length
    assert not queue.restore
    policy.commit(queue)
    queued = policy.decide("disk", cached, tokens, tokens * TOKEN_BYTES)
    if alone.restore:
        assert queued.restore_tokens == alone.restore_tokens


def test_a_look_ahead_that_is_not_committed_queues_nothing():
    clock = FakeClock()
    policy = policy_with({"disk": SLOW_DISK}, clock)
    for _ in range(5):
        decision = policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES, count=False)
        assert not decision.restore
    assert engine_wait_s(policy) == 0.0


def served(verdicts: list[bool], tokens: int, disk: FakeTier = SLOW_DISK) -> float:
    """Seconds until every request of a batch has its KV, as vLLM serves it: the restored
    ones are reached at once and their loads run one after another on the disk, while the
    engine prefills the others one after another."""
    load_s = disk.seconds(tokens * TOKEN_BYTES)
    restored = sum(verdicts)
    return max((len(verdicts) - restored) * truth_recompute_s(0, tokens), restored * load_s)


@pytest.mark.parametrize("tokens", [8192, 32768])
def test_eight_at_once_split_between_a_slow_disk_and_the_engine_beats_both_ends(tokens):
    policy = policy_with({"disk": SLOW_DISK}, FakeClock())
    # Alone, the disk loses: every request would be recomputed.
    assert not policy.decide("disk", 0, tokens, tokens * TOKEN_BYTES).restore
    batch = [BatchHit(0, tokens, tokens * TOKEN_BYTES)] * 8
    verdicts = [d.restore for d in policy.decide_batch("disk", batch)]
    assert 0 < sum(verdicts) < 8
    assert verdicts == sorted(verdicts, reverse=True), "the restores are the batch's first"
    assert served(verdicts, tokens) < min(served([False] * 8, tokens), served([True] * 8, tokens))


def test_a_batch_gains_too_small_to_outlast_the_safety_factor_are_not_taken():
    """At five times the prefill, restoring one of eight would finish the batch ~12 % sooner
    on paper: less than the safety factor, so all eight are recomputed."""
    policy = policy_with({"disk": SLOWER_DISK}, FakeClock())
    batch = [BatchHit(0, 8192, 8192 * TOKEN_BYTES)] * 8
    assert not any(d.restore for d in policy.decide_batch("disk", batch))
    gain = served([True] + [False] * 7, 8192, SLOWER_DISK) / served([False] * 8, 8192)
    assert 0.8 < gain < 1.0


def test_a_batch_of_one_is_the_single_request_rule():
    policy = policy_with({"disk": SLOW_DISK}, FakeClock())
    for tokens in (2048, 8192, 32768):
        (one,) = policy.decide_batch("disk", [BatchHit(0, tokens, tokens * TOKEN_BYTES)])
        assert one == policy.decide("disk", 0, tokens, tokens * TOKEN_BYTES)


def test_a_request_whose_restore_pays_alone_is_restored_wherever_it_is_in_the_batch():
    disk = FakeTier(bandwidth=3e9, latency_s=0.002)
    policy = policy_with({"disk": disk}, FakeClock())
    cold = BatchHit(0, 8192, 8192 * TOKEN_BYTES)  # 0.36 s to load, 0.22 s to prefill
    deep = BatchHit(60_000, 2048, 2048 * TOKEN_BYTES)  # 0.09 s to load, 0.11 s to prefill
    assert policy.decide("disk", deep.cached_tokens, deep.tokens, deep.nbytes).restore
    assert not policy.decide("disk", 0, cold.tokens, cold.nbytes).restore
    decisions = policy.decide_batch("disk", [cold] * 7 + [deep])
    assert decisions[-1].restore and decisions[-1].reason == "restore is faster"
    assert decisions[0].restore and decisions[0].reason == "restore beside the engine's queue"
    assert not decisions[-2].restore


def test_a_batch_behind_a_busy_engine_starts_its_loads_only_when_the_engine_reaches_it():
    """The restores of a batch start when the scheduler reaches the batch, i.e. after the
    engine's queued work: a batch of two behind a long queue gains nothing from the disk."""
    clock = FakeClock()
    policy = policy_with({"disk": SLOW_DISK}, clock)
    hit = BatchHit(0, 8192, 8192 * TOKEN_BYTES)
    idle = [d.restore for d in policy.decide_batch("disk", [hit] * 2)]
    for _ in range(20):  # twenty recomputes decided earlier, still queued on the engine
        policy.commit(policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES))
    queued = [d.restore for d in policy.decide_batch("disk", [hit] * 2)]
    assert idle == queued


@pytest.mark.parametrize("queued", [1, 4, 20])
def test_an_engine_queue_ahead_of_a_batch_does_not_eat_its_safety_margin(queued):
    """The engine's queued work delays every plan of a batch alike, so the margin a split
    must clear is on the batch's own time: the split behind a queue is the idle one (on the
    H200 a first request decided alone, then seven behind its prefill, were all recomputed
    though restoring two would have finished them 20 % sooner)."""
    clock = FakeClock()
    policy = policy_with({"disk": SLOW_DISK}, clock)
    batch = [BatchHit(0, 8192, 8192 * TOKEN_BYTES)] * 8
    idle = [d.restore for d in policy.decide_batch("disk", batch)]
    assert 0 < sum(idle) < 8
    for _ in range(queued):
        policy.commit(policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES))
    assert engine_wait_s(policy) > 0
    assert [d.restore for d in policy.decide_batch("disk", batch)] == idle


def test_committed_verdicts_queue_on_their_resources_and_drain_with_time():
    clock = FakeClock()
    policy = policy_with({"disk": SLOW_DISK}, clock)
    batch = [BatchHit(0, 8192, 8192 * TOKEN_BYTES)] * 8
    decisions = policy.decide_batch("disk", batch)
    for decision in decisions:
        policy.commit(decision)
    recomputed = [d for d in decisions if not d.restore]
    waited = engine_wait_s(policy)
    assert waited == pytest.approx(sum(d.recompute_s for d in recomputed))
    clock.advance(waited + 10.0)  # the engine and the disk have done it all
    assert engine_wait_s(policy) == 0.0
    again = policy.decide_batch("disk", batch)
    assert [d.restore for d in again] == [d.restore for d in decisions]


def test_a_busy_tier_sends_a_request_it_would_win_alone_to_the_engine():
    clock = FakeClock()
    fast_disk = FakeTier(bandwidth=20e9, latency_s=0.001)  # 8k tokens: 54 ms vs ~240 ms
    policy = policy_with({"disk": fast_disk}, clock)
    assert policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES).restore
    # Twenty restores already queued on that disk (more than a second of reads).
    for _ in range(20):
        policy.commit(policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES, queued=False))
    assert not policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES).restore


def test_a_restore_verdict_charges_the_tier_and_a_recompute_the_engine():
    policy = policy_with({"disk": SLOW_DISK}, FakeClock())
    recompute = policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES)
    assert not recompute.restore
    assert [r for r, _ in recompute.charges] == [ENGINE]
    assert recompute.charges[0][1] == pytest.approx(recompute.recompute_s)
    fast = policy_with({"disk": FakeTier(bandwidth=50e9)}, FakeClock())
    restore = fast.decide("disk", 0, 8192, 8192 * TOKEN_BYTES)
    assert restore.restore
    assert [r for r, _ in restore.charges] == ["disk"]


def test_the_decision_off_ignores_the_queues():
    policy = policy_with({"disk": SLOW_DISK}, FakeClock(), enabled=False)
    for _ in range(8):
        decision = policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES)
        policy.commit(decision)
        assert decision.restore and decision.charges == ()


# -- loads behind loads -----------------------------------------------------------------------


def test_a_loads_deadline_covers_the_loads_queued_ahead_of_it():
    clock = FakeClock()
    # A floor under one load's time, so that the deadline is the rule's multiple of it.
    policy = policy_with({"disk": SLOW_DISK}, clock, deadline=DeadlineRule(floor_s=0.05))
    nbytes = 256 << 20
    alone = policy.begin_load("disk", nbytes)
    behind = [policy.begin_load("disk", nbytes) for _ in range(3)]
    assert behind[-1].deadline_s > 3 * alone.deadline_s
    assert behind[-1].predicted_s == pytest.approx(alone.predicted_s)
    # Once they end (one after another, each at the disk's speed), a new load is alone again.
    for ticket in [alone, *behind]:
        clock.advance(SLOW_DISK.seconds(nbytes))
        assert policy.end_load(ticket)
    assert policy.begin_load("disk", nbytes).deadline_s == pytest.approx(alone.deadline_s, rel=0.02)


def test_a_load_that_waited_behind_others_teaches_its_own_time_not_its_wait():
    clock = FakeClock()
    policy = RestorePolicy(PolicySettings(), clock=clock)
    policy.add_tier("disk")
    nbytes = 1 << 30
    tickets = [policy.begin_load("disk", nbytes) for _ in range(8)]
    for ticket in tickets:  # served one after another, 1 s each
        clock.advance(1.0)
        assert policy.end_load(ticket)
    # Eight loads, 1 s of reading each: the tier moves 1 GiB a second, not one per 4.5 s.
    assert predict_restore_s(policy, "disk", nbytes) == pytest.approx(1.0, rel=0.05)


def test_an_abandoned_load_is_no_longer_ahead_of_new_ones():
    clock = FakeClock()
    policy = policy_with({"disk": SLOW_DISK}, clock)
    nbytes = 256 << 20
    stuck = policy.begin_load("disk", nbytes)
    clock.advance(stuck.deadline_s + 0.1)
    assert overdue(policy, stuck)
    policy.abandon_load(stuck)
    fresh = policy.begin_load("disk", nbytes)
    assert fresh.ahead == ()
    _, on_time = run_load(policy, clock, "disk", nbytes, SLOW_DISK.seconds(nbytes))
    assert on_time
