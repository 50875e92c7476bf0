"""Questions tests ask of a ``RestorePolicy`` that no adapter asks, answered from its parts.

Not thread-safe: for a test that drives the policy from one thread.
"""

from __future__ import annotations

from kvtier.policy import LoadTicket, RestorePolicy
from kvtier.policy.backlog import ENGINE


def overdue(policy: RestorePolicy, ticket: LoadTicket) -> bool:
    """True once a running load has passed its deadline (an adapter then abandons it)."""
    if ticket.done or ticket.abandoned:
        return False
    return policy.clock() > ticket.deadline_at_s


def engine_wait_s(policy: RestorePolicy) -> float:
    """Seconds of decided prefill still queued on the engine (0 when idle)."""
    return policy.backlog.wait_s(ENGINE, policy.clock())


def predict_restore_s(policy: RestorePolicy, tier: str, nbytes: int) -> float:
    """Predicted seconds to restore ``nbytes`` from ``tier`` (slow marks and ``via`` too)."""
    return policy.chain.predict_s(tier, nbytes)
