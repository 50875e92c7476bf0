"""The circuit breaker's states, stepped with a fake clock (no server, no sleeping)."""

from __future__ import annotations

from kvtier.store.shared.breaker import CircuitBreaker


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_closed_breaker_allows_every_op() -> None:
    breaker = CircuitBreaker(1.0, 8.0, FakeClock())
    assert all(breaker.allow() for _ in range(5))
    assert not breaker.is_open and breaker.openings == 0


def test_failure_opens_and_refuses_until_the_backoff_ends() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1.0, 8.0, clock)
    breaker.failure()
    assert breaker.is_open and breaker.openings == 1
    clock.now += 0.9
    assert not breaker.allow()


def test_after_the_backoff_exactly_one_op_probes() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1.0, 8.0, clock)
    breaker.failure()
    clock.now += 1.0
    assert breaker.allow()
    assert not breaker.allow()  # others keep missing while the probe is out


def test_successful_probe_closes_and_counts_a_recovery() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1.0, 8.0, clock)
    breaker.failure()
    clock.now += 1.0
    breaker.allow()
    breaker.success()
    assert not breaker.is_open and breaker.recoveries == 1
    assert breaker.allow() and breaker.allow()


def test_failed_probes_double_the_backoff_up_to_the_cap() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1.0, 4.0, clock)
    breaker.failure()
    waits = []
    for _ in range(4):
        start = clock.now
        while not breaker.allow():
            clock.now += 0.25
        waits.append(clock.now - start)
        breaker.failure()
    assert waits == [1.0, 2.0, 4.0, 4.0]
    assert breaker.openings == 1


def test_failures_of_ops_started_before_opening_do_not_extend_it() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1.0, 8.0, clock)
    breaker.failure()
    clock.now += 0.5
    breaker.failure()  # a concurrent op that was already in flight
    clock.now += 0.5
    assert breaker.allow()


def test_a_probe_that_was_not_sent_after_all_leaves_the_probe_to_the_next_op() -> None:
    clock = FakeClock()
    breaker = CircuitBreaker(1.0, 8.0, clock)
    breaker.failure()
    clock.now += 1.0
    assert breaker.allow()
    breaker.not_sent()  # e.g. a share's exchange could not run on this connection
    assert breaker.is_open and breaker.allow()  # still open; the next op is the probe
    breaker.success()
    assert not breaker.is_open and breaker.recoveries == 1
