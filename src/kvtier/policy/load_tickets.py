"""Loads in flight: when each began, when it must end, and what its time teaches the estimate.

Every load gets a deadline from one rule (``kvtier.policy.deadline.DeadlineRule``) applied to
the tier's *unslowed* estimate of the bytes it must wait for: its own and those of the tier's
loads still running when it was submitted, since its reads queue behind theirs and a restore
chosen behind a queue must not be abandoned for waiting. A slow tier is held to the normal
standard, so it recovers only by really meeting it. A tier with no measured load yet gets the
rule's ceiling: its prior knows nothing of this disk or server. An overrun abandons the load
(its blocks become misses), marks the tier slow and feeds the elapsed time into the estimate;
the load's true time, when its I/O finally returns, refines the estimate too.

The estimate learns a load's own time, not its wait: from when the tier began on it (its
submission, or the end of the last load queued ahead of it) to its end. Else eight loads at
once would teach it a tier eight times slower than it is; the wait is the backlog's to
predict (``kvtier.policy.backlog``).

Not thread-safe on its own: ``RestorePolicy`` calls it under its lock, with its clock's time.
"""

from __future__ import annotations

from kvtier.policy.deadline import DeadlineRule
from kvtier.policy.tier_chain import TierChain


class LoadTicket:
    """One load in flight: when it started, when it must end. Made by ``begin_load``."""

    __slots__ = (
        "abandoned",
        "ahead",
        "deadline_s",
        "done",
        "ended_s",
        "nbytes",
        "predicted_s",
        "started_s",
        "tier",
    )

    def __init__(
        self,
        tier: str,
        nbytes: int,
        started_s: float,
        predicted_s: float,
        deadline_s: float,
        ahead: tuple[LoadTicket, ...] = (),
    ) -> None:
        self.tier = tier
        self.nbytes = nbytes
        #: Policy-clock time at submission.
        self.started_s = started_s
        #: Predicted seconds (unslowed estimate, this load alone) and the seconds allowed
        #: (the loads ahead of it on the tier included).
        self.predicted_s = predicted_s
        self.deadline_s = deadline_s
        #: The tier's loads still running when this one was submitted (cleared at its end).
        self.ahead = ahead
        #: Policy-clock time its I/O completed (``end_load``).
        self.ended_s: float | None = None
        self.abandoned = False
        self.done = False

    @property
    def deadline_at_s(self) -> float:
        """Policy-clock time after which the load is overdue."""
        return self.started_s + self.deadline_s

    def __repr__(self) -> str:
        return (
            f"LoadTicket({self.tier!r}, {self.nbytes} B, started {self.started_s:.3f}, "
            f"deadline {self.deadline_s:.3f} s, abandoned={self.abandoned}, done={self.done})"
        )


class LoadTickets:
    """Each tier's loads begun and not ended, judged against the one deadline rule."""

    def __init__(self, rule: DeadlineRule, chain: TierChain) -> None:
        self._rule = rule
        self._chain = chain
        self._running: dict[str, set[LoadTicket]] = {}

    def begin(self, tier: str, nbytes: int, now: float) -> LoadTicket:
        """A load of ``nbytes`` from ``tier`` submitted at ``now``; its deadline is fixed now."""
        est = self._chain.estimate(tier)
        running = self._running.setdefault(tier, set())
        ahead = tuple(t for t in running if not t.abandoned)
        predicted = est.base_seconds(nbytes)
        queued_s = est.base_seconds(nbytes + sum(t.nbytes for t in ahead))
        deadline_s = self._rule.deadline_s(queued_s) if est.loads else self._rule.ceiling_s
        ticket = LoadTicket(tier, nbytes, now, predicted, deadline_s, ahead)
        running.add(ticket)
        return ticket

    def abandon(self, ticket: LoadTicket, now: float) -> None:
        """The adapter gave up on ``ticket`` at ``now``: the tier overran. Idempotent."""
        if ticket.abandoned or ticket.done:
            return
        ticket.abandoned = True
        # No longer ahead of anyone: its unstarted reads are skipped (and the adapter may
        # never end it if its I/O does not return).
        self._running[ticket.tier].discard(ticket)
        ticket.ahead = ()
        self._chain.estimate(ticket.tier).overrun(ticket.nbytes, now - ticket.started_s)
        self._chain.note_evidence(ticket.tier, now)

    def end(self, ticket: LoadTicket, now: float) -> bool:
        """``ticket``'s I/O completed at ``now``; True if it was on time.

        A load that completed late but was not abandoned counts as an overrun (the data is
        still good to use). After ``abandon`` the true time only refines the estimate.
        """
        if ticket.done:
            return False
        ticket.done = True
        ticket.ended_s = now
        self._running[ticket.tier].discard(ticket)
        service = now - _service_start_s(ticket)
        est = self._chain.estimate(ticket.tier)
        self._chain.note_evidence(ticket.tier, now)
        if ticket.abandoned:
            est.record(ticket.nbytes, service)
            return False
        on_time = now - ticket.started_s <= ticket.deadline_s
        est.observe(ticket.nbytes, service, on_time)
        return on_time

    def observe(self, tier: str, nbytes: int, seconds: float, now: float) -> bool:
        """A load or probe without a ticket took ``seconds``; True if within its deadline."""
        est = self._chain.estimate(tier)
        on_time = seconds <= self._rule.deadline_s(est.base_seconds(nbytes))
        est.observe(nbytes, seconds, on_time)
        self._chain.note_evidence(tier, now)
        return on_time


def _service_start_s(ticket: LoadTicket) -> float:
    """When the tier began on ``ticket``'s reads: at its submission, or when the last of the
    loads queued ahead of it ended (module docstring)."""
    ends = [t.ended_s for t in ticket.ahead if t.ended_s is not None]
    ticket.ahead = ()  # a chain of tickets must not keep every earlier one alive
    return max([ticket.started_s, *ends])
