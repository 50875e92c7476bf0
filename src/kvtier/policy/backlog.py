"""The work the decision has sent to the engine and to each tier, and when each will be free.

One request at a time, a tier slower than prefill is never worth restoring from. With several
requests waiting it can be: a restore runs on the tier while the engine prefills the others.
``Backlog`` keeps, per resource (the engine, and each tier by name), the time until which the
work already decided keeps it busy: each verdict adds its predicted seconds after what is
already queued (``charge``), and the queue drains as time passes. ``RestorePolicy`` asks for
the waits (``wait_s``) when it weighs the next requests (its module docstring, "Requests in
flight", says how).

Why predictions and not the engine's real queue: vLLM's extension points show a tier neither
the scheduler's queues nor its step plan. What kvtier decides is what it knows; a request the
decision never sees (no tier hit at all) is prefill work it leaves out, so the engine's queue is
read short and the decision leans to recomputing, the choice it would make alone. A charge that
turns out too long (a request cancelled, a prefill faster than predicted) ends by itself once
its time has passed.

Not thread-safe on its own: ``RestorePolicy`` calls it under its lock.
"""

from __future__ import annotations

#: The engine's resource name: the prefill work queued on the GPU (or the CPU backend).
ENGINE = "engine"


class Backlog:
    """Busy-until times (on the policy's clock) of the engine and the tiers."""

    def __init__(self) -> None:
        self._busy_until: dict[str, float] = {}

    def wait_s(self, resource: str, now: float) -> float:
        """Seconds of decided work still ahead on ``resource`` at ``now`` (0 when idle)."""
        return max(0.0, self._busy_until.get(resource, now) - now)

    def charge(self, resource: str, seconds: float, now: float) -> None:
        """``seconds`` more work on ``resource``, queued after what is there at ``now``."""
        if not seconds > 0:
            return
        self._busy_until[resource] = now + self.wait_s(resource, now) + seconds
