"""When the engine finished computing the blocks of a store job, seen from the scheduler.

The restore decision times a request's prefill from its last lookup to the store jobs that
carry its blocks to kvtier's tier (``kvtier.vllm.tier_decider``). A job reaches the tier
late: vLLM's worker copies a step's blocks off the GPU at the start of the next step, reports
the copy done with a later step's output, and only then does vLLM's host pool hand the job on
(``complete_store``). While the prompt is still prefilling, those later steps are its next
chunks, so every chunk but the last reaches the tier a chunk or two after it was computed,
and prefill timed to the jobs reads slow by more than the decision's margin
(docs/gpu-evidence.md, "The safety factor against a 5 % bound").

The scheduler's own rhythm says when a step was computed. vLLM schedules step ``s + depth``
only once step ``s``'s output is back, where ``depth`` is the number of steps the engine
keeps in flight (``VllmConfig.max_concurrent_batches``: 1 without asynchronous scheduling, 2
with it, the pipeline's stages with pipeline parallelism). So a block scheduled in step ``s``
was computed by the time step ``s + depth`` is scheduled: with the engine busy, at most that
step's scheduling later (a few milliseconds), which CUDA events on the worker confirm
(docs/gpu-evidence.md).

``StepClock`` keeps the times at which the latest steps were scheduled and the step in which
each block about to be stored was scheduled (``kvtier.runtime.step_timed_manager`` tells it
both). It knows nothing of vLLM. Scheduler thread only, like the calls that feed it.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable

#: Step times kept: a job reaches the tier within a few steps of its computation; a job older
#: than this many steps is timed to its arrival instead.
KEPT_STEPS = 4096
#: Blocks between scheduling and their store job's arrival that are remembered; the oldest are
#: forgotten first (a job whose copy failed never arrives). A GPU holds far fewer blocks in
#: flight than this (a 322k-token KV cache is 20k blocks of 16 tokens).
KEPT_KEYS = 1 << 16


#: Added to the decision evidence's device description where prefill is timed by a
#: ``StepClock``: evidence timed to the store jobs' arrival (slow by the steps the jobs trail
#: the compute) is then not adopted, and a reader of the file can tell which it holds.
STEP_TIMED_NOTE = "prefill timed by steps"


class StepClock:
    """The end of the engine step that computed a block, from the scheduler's calls."""

    def __init__(
        self,
        clock: Callable[[], float],
        depth: int,
        kept_steps: int = KEPT_STEPS,
        kept_keys: int = KEPT_KEYS,
    ) -> None:
        """``depth``: steps the engine keeps in flight (``VllmConfig.max_concurrent_batches``)."""
        self._clock = clock
        self.depth = max(int(depth), 1)
        #: Times at which the latest steps were scheduled, the newest last.
        self._times: deque[float] = deque(maxlen=kept_steps)
        #: Steps scheduled so far (the current one included once it has been).
        self._scheduled = 0
        self._scheduled_in: OrderedDict[Hashable, int] = OrderedDict()
        self._kept_keys = kept_keys

    def now(self) -> float:
        """The clock the steps are timed by."""
        return self._clock()

    def step_scheduled(self) -> None:
        """The scheduler has scheduled one more step (vLLM's ``on_schedule_end``)."""
        self._scheduled += 1
        self._times.append(self._clock())

    def will_store(self, keys: Iterable[Hashable]) -> None:
        """These blocks are computed in the step just scheduled and will be stored."""
        step = self._scheduled
        for key in keys:
            self._scheduled_in[key] = step
            self._scheduled_in.move_to_end(key)
        while len(self._scheduled_in) > self._kept_keys:
            self._scheduled_in.popitem(last=False)

    def computed_by(self, keys: Iterable[Hashable]) -> float | None:
        """When the step that computed the last of ``keys`` had surely ended; None when not
        known (no key was seen scheduled, or that end is not yet or no longer recorded).
        Each key is forgotten once asked about."""
        steps = [s for key in keys if (s := self._scheduled_in.pop(key, None)) is not None]
        if not steps:
            return None
        return self._time_of(max(steps) + self.depth)

    def _time_of(self, step: int) -> float | None:
        first = self._scheduled - len(self._times) + 1
        if not first <= step <= self._scheduled:
            return None
        return self._times[step - first]
