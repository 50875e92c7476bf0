"""``RestorePolicy``: one engine's restore decision, its load deadlines and its evidence,
behind one lock.

The jobs live in modules of their own, each usable alone and none locking: the tiers and
their estimates (``kvtier.policy.tier_chain``), the verdicts and why they take the shape they
do (``kvtier.policy.verdicts``: all or nothing per tier, requests in flight, the safety
margins), the work already decided (``kvtier.policy.backlog``), loads and their deadlines
(``kvtier.policy.load_tickets``) and the evidence an earlier process leaves
(``kvtier.policy.evidence``). This class holds their state for one engine and makes each call
one step under its lock.

Safety, beyond the verdicts' margins:

* Priors err towards refusing: a tier is assumed slow and prefill fast until measured.
* Every load gets a deadline (``DeadlineRule``); an overrun abandons the load (its blocks
  become misses), marks the tier slow (predictions inflated) and feeds the elapsed time into
  the estimate. A slow tier recovers after ``recovery_loads`` consecutive on-time loads or
  background probes (``probe_due``): fresh measurements, not time alone.
* ``enabled=False`` turns the decision off: every hit is restored; deadlines still apply.

Thread-safety: every method may be called from any thread (one lock; each call is a few
microseconds of arithmetic, no I/O, so it is fine under the scheduler's lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.policy import evidence as evidence_of
from kvtier.policy import verdicts
from kvtier.policy.backlog import Backlog
from kvtier.policy.evidence import AdoptedEvidence, PolicyEvidence
from kvtier.policy.load_tickets import LoadTicket, LoadTickets
from kvtier.policy.prefill import MIN_PREFILL_EVIDENCE, PrefillCoefficients, PrefillModel
from kvtier.policy.restore import DEFAULT_RESTORE_PRIOR, RestorePrior, TierSnapshot
from kvtier.policy.settings import PolicySettings
from kvtier.policy.tier_chain import TierChain
from kvtier.policy.verdicts import BatchHit, Decision, TierHit

#: A monotonic clock in seconds (``time.monotonic`` unless a test injects a fake).
Clock = Callable[[], float]


@dataclass(frozen=True)
class PolicySnapshot:
    """Everything the policy believes at one moment (for metrics and logs)."""

    enabled: bool
    prefill: PrefillCoefficients
    prefill_evidence: float
    tiers: dict[str, TierSnapshot]


class RestorePolicy:
    """Decides restore vs recompute per hit, and times loads against deadlines.

    Call order for an adapter:

    1. ``add_tier(name, prior)`` once per tier at start-up.
    2. After every engine step that computed prompt tokens:
       ``observe_prefill([(cached, new), ...], seconds)``.
    3. At lookup: ``decide(tier, cached_tokens, hit_tokens, hit_bytes)`` (or
       ``decide_chain``, ``decide_batch``); report only ``decision.restore_tokens`` as hit,
       and ``commit(decision)`` once it is carried out.
    4. For each load submitted: ``ticket = begin_load(tier, nbytes)``; once the policy clock
       passes ``ticket.deadline_at_s``, abandon the job (its blocks are misses) and
       ``abandon_load(ticket)``; on completion ``end_load(ticket)`` (also after an abandon,
       when the I/O finally returns: its true time is evidence too).
    5. Now and then (e.g. the tier's poll): if ``probe_due(tier)``, read a stored record on
       the tier's own thread, off any request's path, and ``observe_load(tier, n, s)``.

    ``chain``, ``backlog`` and ``clock`` are the policy's parts, for inspection; they are not
    thread-safe alone.
    """

    def __init__(
        self,
        settings: PolicySettings | None = None,
        prefill: PrefillModel | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.settings = settings if settings is not None else PolicySettings()
        self.prefill = prefill if prefill is not None else PrefillModel()
        self.clock = clock
        self._lock = threading.Lock()
        self.chain = TierChain(self.settings)
        #: Work already decided, per resource (requests in flight: ``kvtier.policy.verdicts``).
        self.backlog = Backlog()
        self._loads = LoadTickets(self.settings.deadline, self.chain)

    # -- set-up ---------------------------------------------------------------------------

    def add_tier(
        self,
        name: str,
        prior: RestorePrior = DEFAULT_RESTORE_PRIOR,
        via: str | None = None,
        writing: Callable[[], bool] | None = None,
    ) -> None:
        """Register a tier with its prior (assumed until measured; choose it on the slow side).

        ``via``: a tier added earlier whose copy this tier's restores also pay, e.g. a disk
        tier whose loads land in the host pool and then take the host pool's copy to the
        engine: ``add_tier("disk", via="host")``. Predictions for ``name`` then add ``via``'s;
        loads of ``name`` (``begin_load``) are timed and judged on their own.

        ``writing``: whether the tier is writing now (stores queued). A load then shares the
        device with the writes, and its prediction is not taken as within the evidence
        (``TierChain.margin``); None: never.
        """
        with self._lock:
            self.chain.add(name, prior, via, writing)

    # -- evidence -------------------------------------------------------------------------

    def observe_prefill(self, segments: Sequence[tuple[int, int]], seconds: float) -> bool:
        """One engine step computed these ``(cached, new)`` segments in ``seconds``."""
        with self._lock:
            return self.prefill.observe_step(segments, seconds)

    def observe_load(self, tier: str, nbytes: int, seconds: float) -> bool:
        """A load or probe without a ticket took ``seconds``; True if within its deadline."""
        with self._lock:
            return self._loads.observe(tier, nbytes, seconds, self.clock())

    def probe_due(self, tier: str) -> bool:
        """Whether the adapter should probe ``tier`` now (and this call claims the probe).

        Due for a tier that is slow or was never measured, once per ``probe_interval_s``:
        the only way a refused tier can show that it recovered.
        """
        with self._lock:
            est = self.chain.estimate(tier)
            now = self.clock()
            if not (est.slow or est.loads == 0):
                return False
            if now - self.chain.last_evidence_s(tier) < self.settings.probe_interval_s:
                return False
            self.chain.note_evidence(tier, now)
            return True

    # -- the decision ---------------------------------------------------------------------

    def decide(
        self,
        tier: str,
        cached_tokens: int,
        hit_tokens: int,
        hit_bytes: int,
        *,
        count: bool = True,
        queued: bool = True,
    ) -> Decision:
        """Restore a hit of ``hit_tokens`` (``hit_bytes``) after ``cached_tokens``, or not."""
        return self.decide_chain(
            cached_tokens, [TierHit(tier, hit_tokens, hit_bytes)], count=count, queued=queued
        )

    def decide_chain(
        self,
        cached_tokens: int,
        hits: Sequence[TierHit],
        *,
        count: bool = True,
        queued: bool = True,
    ) -> Decision:
        """The best prefix of a chain of tier hits to restore (``kvtier.policy.verdicts``).

        ``count=False``: a look-ahead, not a verdict (refusals are not counted in the
        tiers' ``refused``). ``queued=False``: weigh the request as if the engine and the
        tiers were idle (the backlog of decided work left out). The adapter passes the
        chosen plan to ``commit`` once it carries it out.
        """
        with self._lock:
            decision, refused = verdicts.decide_chain(
                self.chain,
                self.prefill,
                self.settings,
                cached_tokens,
                hits,
                self._waits() if queued else verdicts.idle,
            )
            for tier in refused if count else ():
                self.chain.estimate(tier).refused += 1
        return decision

    def decide_batch(self, tier: str, hits: Sequence[BatchHit]) -> list[Decision]:
        """Verdicts for requests looked up in one scheduler step, in the scheduler's order:
        restore the first ``m`` and any whose restore pays alone, recompute the others, with
        the ``m`` that finishes the whole batch first (``kvtier.policy.verdicts``, "Requests
        in flight"). One ``Decision`` per hit, each to be passed to ``commit``."""
        verdicts.check_batch(hits)
        if len(hits) <= 1 or not self.settings.enabled:
            return [self.decide(tier, h.cached_tokens, h.tokens, h.nbytes) for h in hits]
        with self._lock:
            decisions = verdicts.decide_batch(
                self.chain, self.prefill, self.settings, tier, hits, self._waits()
            )
            self.chain.estimate(tier).refused += sum(not d.restore for d in decisions)
        return decisions

    def refuse_every_hit(
        self, tier: str, max_tokens: int, block_tokens: int, block_bytes: int
    ) -> Decision | None:
        """A recompute verdict that holds for any hit of ``tier`` in a prompt of at most
        ``max_tokens`` tokens, wherever it starts and however long it is; None if some hit
        could pay, while prefill is queued on the engine, or with the decision off
        (``kvtier.policy.verdicts.refuse_every_hit`` says why one comparison covers every
        hit)."""
        if not self.settings.enabled:
            return None
        with self._lock:
            decision = verdicts.refuse_every_hit(
                self.chain, self.prefill, tier, max_tokens, block_tokens, block_bytes, self._waits()
            )
            if decision is not None:
                self.chain.estimate(tier).refused += 1
        return decision

    def restore_never_pays(
        self, tier: str, max_tokens: int, block_tokens: int, block_bytes: int
    ) -> bool:
        """Whether, on what is measured, no hit of ``tier`` could be restored in any prompt
        of at most ``max_tokens`` tokens even with the engine idle (``verdicts.never_pays``):
        the tier's writes are then spent on hits every verdict refuses. False with the
        decision off, or until both the engine's prefill and the tier's loads are measured."""
        if not self.settings.enabled:
            return False
        with self._lock:
            if self.prefill.evidence < MIN_PREFILL_EVIDENCE:
                return False
            if self.chain.estimate(tier).measured == 0:
                return False
            return verdicts.never_pays(
                self.chain, self.prefill, self.settings, tier, max_tokens, block_tokens, block_bytes
            )

    def commit(self, decision: Decision) -> None:
        """The adapter carries ``decision`` out: its work joins the backlog that later
        decisions weigh (requests in flight; a decision never committed is a look-ahead)."""
        with self._lock:
            now = self.clock()
            for resource, seconds in decision.charges:
                self.backlog.charge(resource, seconds, now)

    def predict_recompute_s(self, cached_tokens: int, tokens: int) -> float:
        """Predicted seconds for the engine to compute ``tokens`` after ``cached_tokens``."""
        with self._lock:
            return self.prefill.recompute_seconds(cached_tokens, tokens)

    def _waits(self) -> verdicts.WaitS:
        """The backlog's waits as of now (under the lock)."""
        now = self.clock()
        return lambda resource: self.backlog.wait_s(resource, now)

    # -- deadlines ------------------------------------------------------------------------

    def begin_load(self, tier: str, nbytes: int) -> LoadTicket:
        """Start the clock on a load of ``nbytes`` from ``tier``; its deadline is fixed now
        (``kvtier.policy.load_tickets``)."""
        with self._lock:
            return self._loads.begin(tier, nbytes, self.clock())

    def abandon_load(self, ticket: LoadTicket) -> None:
        """The adapter gave up on the load (blocks become misses): mark the tier slow.

        Idempotent. The adapter must not reuse the load's buffers until its I/O returns; it
        then calls ``end_load``, whose (late) time also enters the estimate.
        """
        with self._lock:
            self._loads.abandon(ticket, self.clock())

    def end_load(self, ticket: LoadTicket) -> bool:
        """The load's I/O completed; returns True if it was on time.

        A load that completed late but was not abandoned counts as an overrun (the data is
        still good to use). After ``abandon_load`` the true time only refines the estimate.
        """
        with self._lock:
            return self._loads.end(ticket, self.clock())

    # -- evidence of an earlier process ---------------------------------------------------

    def evidence(self) -> PolicyEvidence:
        """The measurements behind the models now (``kvtier.policy.evidence``)."""
        with self._lock:
            return evidence_of.gather(self.prefill, self.chain)

    def adopt(self, evidence: PolicyEvidence) -> AdoptedEvidence:
        """Replay an earlier process's measurements, oldest first, as if measured now.

        Loads of a tier this policy does not have are skipped. Slow marks are not touched:
        a replayed load counts towards the fit and the throughput shown, not a deadline.
        """
        with self._lock:
            return evidence_of.replay(evidence, self.prefill, self.chain)

    # -- introspection --------------------------------------------------------------------

    def snapshot(self) -> PolicySnapshot:
        with self._lock:
            return PolicySnapshot(
                enabled=self.settings.enabled,
                prefill=self.prefill.coefficients(),
                prefill_evidence=self.prefill.evidence,
                tiers={name: est.snapshot() for name, est in self.chain.estimates()},
            )
