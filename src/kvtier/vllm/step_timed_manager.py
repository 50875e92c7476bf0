"""vLLM's offloading manager, unchanged, telling a ``StepClock`` about each scheduler step.

kvtier's CUDA spec returns this in place of the manager vLLM's tiering spec builds: every call
goes to that manager as it is; two are also noted on the way (``kvtier.vllm.step_clock``):

* ``on_schedule_end``: vLLM calls it once per scheduled step, so its times are the steps';
* ``prepare_store``: called in the same step for the blocks that step computes, so the blocks
  vLLM's host pool accepts (``keys_to_store``) were scheduled in it.

kvtier's tiers cannot note this themselves: vLLM's tiering manager forwards
``on_schedule_end`` to them but never says which blocks a step will store, and their store
jobs arrive steps later.
"""

from __future__ import annotations

from typing import Any

from kvtier.vllm.step_clock import StepClock


class StepTimedManager:
    """Delegates to vLLM's manager; notes step times and the blocks each step stores."""

    def __init__(self, manager: Any, step_clock: StepClock) -> None:
        self.manager = manager
        self.step_clock = step_clock

    def on_schedule_end(self, context: Any) -> None:
        self.step_clock.step_scheduled()
        self.manager.on_schedule_end(context)

    def prepare_store(self, keys: Any, req_context: Any) -> Any:
        output = self.manager.prepare_store(keys, req_context)
        if output is not None:
            self.step_clock.will_store(output.keys_to_store)
        return output

    def __getattr__(self, name: str) -> Any:
        # Everything else is vLLM's manager's, looked up on each call (only reached for
        # attributes this class does not define; "manager" itself only before __init__ set it,
        # e.g. while a copy is being made).
        if name == "manager":
            raise AttributeError(name)
        return getattr(self.manager, name)
