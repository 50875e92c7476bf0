"""The soak's fault schedule and attribution, without servers."""

import itertools
import random

from benchmarks.soak.faults import KILLS, KINDS, RECOVERY_S, FaultBook, plan

TARGETS = {kind: ["a", "b"] for kind in KINDS}


def schedule(seed: int) -> list:
    return plan(random.Random(seed), 3600, 30, 2.8, list(KINDS), TARGETS, 300)


def test_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)


def test_an_hour_plans_over_a_thousand_faults_of_every_kind_with_kills_spaced() -> None:
    planned = schedule(1)
    assert len(planned) >= 1000
    assert {p.kind for p in planned} == set(KINDS)
    for family in (("engine_sigkill",), ("redis_kill", "redis_restart_empty")):
        kills = [p.at_s for p in planned if p.kind in family]
        assert all(b - a >= 300 for a, b in itertools.pairwise(kills)), family
    assert all(30 < p.at_s < 3600 - RECOVERY_S for p in planned)
    assert set(KILLS) <= set(KINDS)


def test_a_request_gets_the_faults_on_its_resources_within_the_recovery_window() -> None:
    clock = [0.0]
    emitted: list[dict] = []
    book = FaultBook(lambda event, /, **f: emitted.append({"type": event, **f}), lambda: clock[0])
    redis = book.open("redis_sigstop", "redis")
    clock[0] = 2.0
    book.close(redis, "stopped")
    disk = book.open("disk_full", "disk-b")  # still open
    assert book.active({"srv-a", "redis"}, 1.0, 1.5) == [redis.id]
    assert book.active({"srv-a", "redis"}, 2.0 + RECOVERY_S + 0.1, 9.0) == []
    assert book.active({"disk-b"}, 100.0, 101.0) == [disk.id]
    assert emitted == [
        {
            "type": "fault",
            "t": 0.0,
            "id": redis.id,
            "end_t": 2.0,
            "kind": "redis_sigstop",
            "target": "redis",
            "detail": "stopped",
            "injected_kill": False,
        }
    ]
