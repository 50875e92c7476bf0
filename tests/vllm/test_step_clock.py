"""When the engine computed a stored block, from the scheduler's calls (no engine)."""

from types import SimpleNamespace

import pytest

from kvtier.runtime.step_clock import StepClock
from kvtier.runtime.step_timed_manager import StepTimedManager


class Clock:
    def __init__(self) -> None:
        self.now = 10.0

    def __call__(self) -> float:
        return self.now


def steps_at(clock: Clock, steps: StepClock, times: list[float]) -> None:
    for t in times:
        clock.now = t
        steps.step_scheduled()


def test_a_block_was_computed_when_the_step_depth_steps_later_was_scheduled():
    """Two steps in flight (asynchronous scheduling): step s + 2 is scheduled only once step
    s's output is back, so that is when s's blocks were surely computed."""
    clock = Clock()
    steps = StepClock(clock, depth=2)
    steps_at(clock, steps, [10.0])
    steps.will_store(["a", "b", "c"])  # scheduled in step 1
    steps_at(clock, steps, [10.001])  # step 2 goes at once: the queue had room
    assert steps.computed_by(["c"]) is None, "step 3 not scheduled yet"
    steps_at(clock, steps, [10.5])  # step 3, once step 1 was done
    assert steps.computed_by(["a", "b"]) == 10.5
    assert steps.computed_by(["b"]) is None, "a key is forgotten once asked about"


def test_one_step_in_flight_ends_at_the_next_step():
    clock = Clock()
    steps = StepClock(clock, depth=1)
    steps_at(clock, steps, [1.0])
    steps.will_store(["a"])
    steps_at(clock, steps, [1.5, 2.0])
    assert steps.computed_by(["a"]) == 1.5


def test_a_job_of_blocks_from_several_steps_ends_with_the_last_one():
    clock = Clock()
    steps = StepClock(clock, depth=2)
    steps_at(clock, steps, [1.0])
    steps.will_store(["early"])
    steps_at(clock, steps, [1.1])
    steps.will_store(["late"])
    steps_at(clock, steps, [2.0, 3.0])
    assert steps.computed_by(["early", "late", "never scheduled"]) == 3.0
    assert steps.computed_by(["never scheduled"]) is None


def test_what_is_no_longer_kept_is_not_known():
    clock = Clock()
    steps = StepClock(clock, depth=1, kept_steps=3, kept_keys=2)
    steps_at(clock, steps, [1.0])
    steps.will_store(["a", "b", "c"])  # "a" is forgotten: two keys kept
    steps_at(clock, steps, [2.0])
    assert steps.computed_by(["a"]) is None
    assert steps.computed_by(["b"]) == 2.0
    steps_at(clock, steps, [3.0, 4.0, 5.0])  # step 2's time falls out of the three kept
    assert steps.computed_by(["c"]) is None


class Manager:
    """vLLM's manager as the connector's scheduler calls it (the calls recorded)."""

    def __init__(self, accepted: list[str] | None) -> None:
        self.calls: list[str] = []
        self.accepted = accepted
        self.secondary_tiers = ["disk"]

    def on_schedule_end(self, context):
        self.calls.append(f"on_schedule_end {context}")

    def prepare_store(self, keys, req_context):
        self.calls.append(f"prepare_store {keys} {req_context}")
        if self.accepted is None:
            return None
        return SimpleNamespace(keys_to_store=self.accepted)

    def has_pending_work(self) -> bool:
        self.calls.append("has_pending_work")
        return True

    def prepare_load(self, keys, req_context):
        self.calls.append(f"prepare_load {keys} {req_context}")
        return "src-spec"

    def complete_load(self, keys, req_context):
        self.calls.append(f"complete_load {keys} {req_context}")


def test_the_manager_is_vllms_own_with_each_step_and_its_stores_noted():
    clock = Clock()
    steps = StepClock(clock, depth=1)
    inner = Manager(accepted=["new"])
    manager = StepTimedManager(inner, steps, schedule_end_last=False)
    clock.now = 1.0
    manager.on_schedule_end("ctx")
    output = manager.prepare_store(["held", "new"], "req")
    assert output.keys_to_store == ["new"]
    assert manager.has_pending_work() is True and manager.secondary_tiers == ["disk"]
    assert inner.calls == [
        "on_schedule_end ctx",
        "prepare_store ['held', 'new'] req",
        "has_pending_work",
    ]
    clock.now = 2.0
    manager.on_schedule_end("ctx")
    # Only the blocks vLLM's host pool accepted are timed; the one it held is not stored.
    assert steps.computed_by(["held"]) is None
    assert steps.computed_by(["new"]) == 2.0


def test_a_store_the_host_pool_refused_is_not_noted():
    steps = StepClock(Clock(), depth=1)
    manager = StepTimedManager(Manager(accepted=None), steps, schedule_end_last=False)
    manager.on_schedule_end("ctx")
    assert manager.prepare_store(["k"], "req") is None
    manager.on_schedule_end("ctx")
    assert steps.computed_by(["k"]) is None


def test_a_load_from_the_host_pool_is_timed_from_its_preparing_to_its_completion():
    clock = Clock()
    loads: list[tuple[int, float]] = []
    inner = Manager(accepted=["new"])
    manager = StepTimedManager(
        inner, StepClock(clock, depth=2), lambda n, s: loads.append((n, s)), schedule_end_last=True
    )
    clock.now = 1.0
    assert manager.prepare_load(["a", "b"], "req") == "src-spec"
    clock.now = 1.25
    manager.complete_load({"a", "b"}, "req")
    assert loads == [(2, 0.25)]
    assert inner.calls[0] == "prepare_load ['a', 'b'] req"
    assert inner.calls[1].startswith("complete_load {") and len(inner.calls) == 2
    manager.complete_load(["a"], "req")  # completed twice, or never prepared: not timed
    assert loads == [(2, 0.25)]


def test_a_load_that_waited_for_a_computing_step_is_not_timed():
    """The engine computed blocks while the load was under way (a store was prepared): the
    load's time then holds that step's, which is not the copy's."""
    clock = Clock()
    loads: list[tuple[int, float]] = []
    manager = StepTimedManager(
        Manager(accepted=["new"]),
        StepClock(clock, depth=2),
        lambda n, s: loads.append((n, s)),
        schedule_end_last=False,
    )
    manager.prepare_load(["a"], "req")
    manager.prepare_store(["new"], "other")
    clock.now = 3.0
    manager.complete_load(["a"], "req")
    assert loads == []
    refused = StepTimedManager(
        Manager(accepted=[]),
        StepClock(clock, depth=2),
        lambda n, s: loads.append((n, s)),
        schedule_end_last=True,
    )
    refused.prepare_load(["a"], "req")
    refused.prepare_store(["held"], "other")  # nothing stored: nothing computed for it
    clock.now = 3.5
    refused.complete_load(["a"], "req")
    assert loads == [(1, 0.5)]


def test_without_an_observer_loads_are_only_forwarded():
    inner = Manager(accepted=None)
    manager = StepTimedManager(inner, StepClock(Clock(), depth=1), schedule_end_last=False)
    manager.prepare_load(["a"], "req")
    manager.complete_load(["a"], "req")
    assert manager._loading == {}
    assert inner.calls == ["prepare_load ['a'] req", "complete_load ['a'] req"]


def run_steps(schedule_end_last: bool, stores: list[list[str]]) -> StepTimedManager:
    """One step per entry of ``stores`` (the keys it computes), scheduled at 1.0, 2.0, ...,
    the manager's calls in the order the release makes them."""
    clock = Clock()
    inner = Manager(accepted=None)
    inner.prepare_store = lambda keys, ctx: SimpleNamespace(keys_to_store=list(keys))
    manager = StepTimedManager(
        inner, StepClock(clock, depth=2), schedule_end_last=schedule_end_last
    )
    for step, keys in enumerate(stores, start=1):
        clock.now = float(step)
        if not schedule_end_last:
            manager.on_schedule_end("ctx")
        if keys:
            manager.prepare_store(keys, "req")
        if schedule_end_last:
            manager.on_schedule_end("ctx")
    return manager


@pytest.mark.parametrize("schedule_end_last", [False, True])
def test_a_store_is_counted_against_its_own_step_whichever_call_ends_it(schedule_end_last):
    """Up to vLLM 0.32 a step's ``on_schedule_end`` comes before its stores, from 0.33 after
    them: either way a block stored in step 2 was computed once step 4 was scheduled."""
    manager = run_steps(schedule_end_last, [["a"], ["b", "c"], [], ["d"]])
    steps = manager.step_clock
    assert steps.computed_by(["a"]) == 3.0
    assert steps.computed_by(["b", "c"]) == 4.0
    assert steps.computed_by(["d"]) is None, "step 6 not scheduled yet"


@pytest.mark.parametrize("schedule_end_last", [False, True])
def test_the_managers_lock_and_other_members_are_vllms(schedule_end_last):
    """From 0.33 the scheduler holds ``manager.lock`` for a step: it is the wrapped manager's."""
    inner = Manager(accepted=None)
    inner.lock = object()
    manager = StepTimedManager(
        inner, StepClock(Clock(), depth=1), schedule_end_last=schedule_end_last
    )
    assert manager.lock is inner.lock and manager.secondary_tiers == ["disk"]
