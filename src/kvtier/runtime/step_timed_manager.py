"""vLLM's offloading manager, unchanged, telling a ``StepClock`` about each scheduler step.

kvtier's CUDA spec returns this in place of the manager vLLM's tiering spec builds: every call
goes to that manager as it is; two are also noted on the way (``kvtier.runtime.step_clock``):

* ``on_schedule_end``: vLLM calls it once per scheduled step, so its times are the steps';
* ``prepare_store``: called in the same step for the blocks that step computes, so the blocks
  vLLM's host pool accepts (``keys_to_store``) were scheduled in it.

Which of the two comes first in a step depends on the vLLM release (``schedule_end_last``): up
to 0.32 the scheduler ends a step's scheduling with ``on_schedule_end`` before it prepares
that step's stores; from 0.33 it prepares the stores first and calls ``on_schedule_end`` last.
A store is counted against its own step either way: where the tick comes last, the step's
accepted keys wait for it, so that they are not counted against the step before.

kvtier's tiers cannot note these themselves: vLLM's tiering manager forwards
``on_schedule_end`` to them but never says which blocks a step will store, and their store
jobs arrive steps later.

And one pair is timed: ``prepare_load`` (the scheduler sends a request's blocks from the host
pool to the GPU) to ``complete_load`` (the workers reported them copied), the host pool's copy
that every restore from a kvtier tier pays after its own load. Nothing else measures it on
CUDA: vLLM's own spec runs the host pool, and a fixed prior for it (PCIe at 12 GB/s) is
several times slow on a faster link, enough to tip a close verdict toward recomputing
(docs/gpu-evidence.md, "The safety factor against a 5 % bound"). The time includes the step
or two the report takes to come back, so it errs slow, towards recomputing. A load during
which the engine computed blocks (a store was prepared) is not timed: it waited for that
step, which is the engine's time, not the copy's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvtier.runtime.step_clock import StepClock

#: Loads prepared and not completed that are remembered: a load vLLM never completes (a
#: request aborted in between) must not hold its keys for ever.
MAX_LOADING_KEYS = 1 << 16


class StepTimedManager:
    """Delegates to vLLM's manager; notes step times and the blocks each step stores, and
    times the host pool's loads to the GPU."""

    def __init__(
        self,
        manager: Any,
        step_clock: StepClock,
        on_load: Callable[[int, float], None] | None = None,
        *,
        schedule_end_last: bool,
    ) -> None:
        """``on_load(keys, seconds)``: one load from the host pool to the GPU completed.
        ``schedule_end_last``: vLLM calls ``on_schedule_end`` after the step's stores are
        prepared (``Release.schedule_end_last``), else before."""
        self.manager = manager
        self.step_clock = step_clock
        self._on_load = on_load
        self.schedule_end_last = schedule_end_last
        #: Keys the host pool accepted in the step whose ``on_schedule_end`` is still to come
        #: (only where it comes last).
        self._step_stores: list[Any] = []
        #: Per key loading to the GPU: when it was prepared, and ``_stores`` then.
        self._loading: dict[Any, tuple[float, int]] = {}
        #: Stores prepared so far (a step that computed blocks).
        self._stores = 0

    def prepare_load(self, keys: Any, req_context: Any) -> Any:
        spec = self.manager.prepare_load(keys, req_context)
        if self._on_load is not None:
            if len(self._loading) > MAX_LOADING_KEYS:
                self._loading.clear()  # only timings are lost
            began = (self.step_clock.now(), self._stores)
            for key in keys:
                self._loading.setdefault(key, began)
        return spec

    def complete_load(self, keys: Any, req_context: Any) -> None:
        self.manager.complete_load(keys, req_context)
        if self._on_load is None:
            return
        began = [b for key in keys if (b := self._loading.pop(key, None)) is not None]
        if began and all(stores == self._stores for _, stores in began):
            self._on_load(len(began), self.step_clock.now() - min(t for t, _ in began))

    def on_schedule_end(self, context: Any) -> None:
        self.step_clock.step_scheduled()
        if self._step_stores:
            self.step_clock.will_store(self._step_stores)
            self._step_stores = []
        self.manager.on_schedule_end(context)

    def prepare_store(self, keys: Any, req_context: Any) -> Any:
        output = self.manager.prepare_store(keys, req_context)
        if output is not None:
            if self.schedule_end_last:
                self._step_stores.extend(output.keys_to_store)
            else:
                self.step_clock.will_store(output.keys_to_store)
            if output.keys_to_store:
                self._stores += 1
        return output

    def __getattr__(self, name: str) -> Any:
        # Everything else is vLLM's manager's, looked up on each call (only reached for
        # attributes this class does not define; "manager" itself only before __init__ set it,
        # e.g. while a copy is being made).
        if name == "manager":
            raise AttributeError(name)
        return getattr(self.manager, name)
