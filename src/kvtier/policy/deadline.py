"""Deadlines for tier loads: a stalled disk or server costs at most this, never a hung request.

``deadline = min(ceiling_s, max(floor_s, multiplier * predicted_s))``

* ``multiplier`` x the tier's predicted time (unslowed): room for ordinary jitter and
  queueing, tight enough that a stall is noticed while recompute is still the better plan.
* ``floor_s``: a load predicted at microseconds is not abandoned over a scheduling hiccup
  (a busy host's I/O threads, the engine's next poll).
* ``ceiling_s``: a hard bound whatever the estimate says (a poisoned estimate cannot grant
  a load minutes). The ceiling wins over the floor.

On overrun the adapter abandons the load (its blocks become misses and are recomputed), and
the policy marks the tier slow and feeds the elapsed time into its estimate
(``RestorePolicy.abandon_load``). Worst case for a request whose restore stalls: the deadline
plus the recompute it would have paid anyway.
"""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import Field, model_validator

from kvtier.settings import SettingsModel, with_fix


class DeadlineRule(SettingsModel):
    """How long a load may take before it is abandoned."""

    component: ClassVar[str] = "policy deadline"

    #: Hard upper bound in seconds, whatever the prediction.
    ceiling_s: float = Field(
        default=30.0, gt=0, allow_inf_nan=False, **with_fix("give seconds > 0, e.g. 30")
    )
    #: Allowed multiple of the predicted load time.
    multiplier: float = Field(
        default=4.0, ge=1, allow_inf_nan=False, **with_fix("give a number >= 1, e.g. 4")
    )
    #: Lower bound in seconds. No load is abandoned sooner: on a busy host a load waits for
    #: I/O threads and for the engine's next step (when vLLM polls jobs) for tens to hundreds
    #: of milliseconds.
    floor_s: float = Field(
        default=1.0, ge=0, allow_inf_nan=False, **with_fix("give seconds >= 0, e.g. 1")
    )

    @model_validator(mode="after")
    def _floor_under_ceiling(self) -> Self:
        if self.floor_s > self.ceiling_s:
            raise ValueError(
                f"floor_s={self.floor_s}; give 0 <= floor_s <= ceiling_s ({self.ceiling_s}), e.g. 1"
            )
        return self

    def deadline_s(self, predicted_s: float) -> float:
        """Seconds a load predicted to take ``predicted_s`` may run before it is abandoned."""
        if not predicted_s >= 0:
            raise ValueError(f"policy: predicted time {predicted_s!r} s must be >= 0")
        return min(self.ceiling_s, max(self.floor_s, self.multiplier * predicted_s))
