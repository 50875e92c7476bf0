"""Restore or recompute: the decision, the load deadlines and the evidence that feeds them.

Invariant 9 (docs/architecture.md): a tier's hit is restored only when its predicted restore
time beats recomputing the same tokens, and every load has a deadline. ``RestorePolicy``
holds one ``TierEstimate`` per tier and one ``PrefillModel`` for the engine, both learned
online from what the adapters measure, and answers the scheduler's question for each hit.

Why the choice is all or nothing per tier
-----------------------------------------
A hit of a tier covers tokens ``[M, M + N)``, ``M`` tokens being available already (engine
prefix cache and the tiers before this one). Only a prefix of the hit can be restored: KV of
later tokens is useless without that of earlier ones, and the engine computes a contiguous
suffix. Restoring the first ``k`` tokens and recomputing the other ``N - k`` costs

    T(k) = [k > 0] * (L + beta * k)  +  sum over p in [M + k, M + N) of (b + c * p)

with ``L`` the tier's fixed latency and ``beta`` its seconds per token (bytes per token /
bandwidth), and ``b + c * p`` the cost of computing the token at position ``p`` (its own work
plus attention to the ``p`` tokens before it; ``PrefillModel``). The step cost ``a`` is paid
either way: the prompt's remaining tokens need a step regardless. The increments are

    T(1) - T(0)   = L + beta - (b + c * M)
    T(k) - T(k-1) = beta - (b + c * (M + k - 1))        for k >= 2

and never grow with ``k`` (``L, c >= 0``): restoring costs the same per token wherever the
token sits, recomputing costs more the later the token. ``T`` is therefore concave, and a
concave function on ``0..N`` takes its minimum at an end: restore the whole hit or none of it.
A split (restore the first part, recompute the rest) is never better; the tokens a split
would recompute are exactly the most expensive ones to recompute. The same holds over a chain
of tiers (host pool, then disk, then a shared store): within each tier's segment the cost is
concave, so the best plan restores the hits of the first ``j`` tiers and recomputes the rest,
for some ``j``; ``decide_chain`` evaluates every ``j`` (not a greedy tier-by-tier choice,
which could refuse a marginal first tier that a fast second tier makes worth restoring).

What the model leaves out, and why it does not change the answer much: restores of
different tiers are summed though they may overlap (conservative); chunked prefill adds the
step cost ``a`` per ``max_step_tokens`` recomputed (``PrefillModel`` charges it), a staircase
that can make a split save at most a few step costs.

Requests in flight
------------------
A restore occupies the tier, not the engine; the two can overlap when several requests wait.
vLLM's scheduler admits waiting requests in order, and only while its step's token budget
lasts: a request is *reached* once the engine has taken up the work queued ahead of it, and
only then does its load start (a load uses no budget: the scheduler goes on to the next
request in the same step). ``kvtier.policy.backlog`` keeps the predicted work of the verdicts
already given (``commit``): ``W_e`` on the engine, ``W_t`` on each tier. So for one request

    finish(0) = W_e + T_recompute
    finish(j) = max(W_e, W_t) + s * R_j + rest_j

(``s`` the safety factor, ``R_j`` plan ``j``'s restore time, ``rest_j`` its recompute). The
engine's wait is paid either way, so it changes nothing for a request alone; a busy tier makes
its restores dearer. The gain is in a *batch*: requests looked up in the same scheduler step
(``decide_batch``; under load the scheduler reaches the waiting requests together once the
running prefills leave it budget). Restoring the first ``m`` of them, in the scheduler's order,
starts their loads at once while the engine prefills the others, and the batch is done when
both are:

    done(m) = max(max(W_e, W_t) + s * sum R_i for the restored,  W_e + sum T_i for the rest)

``decide_batch`` takes the ``m`` that finishes the batch first (the fewest restores among
equals) if its own time (``done(m) - W_e``: the queue ahead delays every plan alike) beats
``m = 0``'s by the safety factor too, and a request whose restore pays alone
is restored wherever it is. Restoring later
requests instead of the first ones would start their loads only when the engine reached them,
too late to overlap. A batch of one is the single-request rule above.

Safety
------
* A restore is chosen only when predicted faster by ``safety_factor`` (1.2), or by
  ``safety_factor_within_evidence`` (1.05) where every prediction it rests on interpolates
  measurements (``_factor``): the hit no larger than the tier's recent loads, nor than its
  ``via`` tier's, the prompt no longer than the longest the prefill model was measured
  on, and no tier loaded from writing now (a load that shares the disk with write-back reads
  slower than the same load alone, by more than that margin). Within the evidence the models
  come within a few percent (once prefill is timed to the step that computed it) and a
  missed gain should cost at most 5 %; beyond it they extrapolate by more than 5 %, and a
  margin of 1.05 there takes restores that are slower (docs/gpu-evidence.md, "The safety
  factor against a 5 % bound"). The margin a batch's overlap must beat is
  ``safety_factor``: the overlap is a prediction nothing measures.
* Priors err towards refusing: a tier is assumed slow and prefill fast until measured.
* Every load gets a deadline (``DeadlineRule``); an overrun abandons the load (its blocks
  become misses), marks the tier slow (predictions inflated) and feeds the elapsed time into
  the estimate. A slow tier recovers after ``recovery_loads`` consecutive on-time loads or
  background probes (``probe_due``): fresh measurements, not time alone.
* ``enabled=False`` turns the decision off: every hit is restored; deadlines still apply.

Evidence of an earlier process
------------------------------
``evidence()`` gives the measurements behind the models (the last prefill steps and each
tier's last loads), ``adopt`` replays such a record into a fresh policy, oldest first, as if
measured now: the prefill steps then count as evidence and new measurements outweigh them
within a few half-lives. Whether a record applies (same engine, same hardware) is the caller's
to judge (``kvtier.policy.evidence_file``); slow marks are never carried over.

Thread-safety: every method may be called from any thread (one lock; each call is a few
microseconds of arithmetic, no I/O, so it is fine under the scheduler's lock).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.policy.backlog import ENGINE, Backlog
from kvtier.policy.prefill import MeasuredStep, PrefillCoefficients, PrefillModel
from kvtier.policy.restore import (
    DEFAULT_RESTORE_PRIOR,
    MeasuredLoad,
    RestorePrior,
    TierEstimate,
    TierSnapshot,
)
from kvtier.policy.settings import PolicySettings

#: A monotonic clock in seconds (``time.monotonic`` unless a test injects a fake).
Clock = Callable[[], float]


@dataclass(frozen=True)
class TierHit:
    """One tier's contiguous hit, in chain order (after the engine's own cached tokens)."""

    #: The tier's name as given to ``RestorePolicy.add_tier``.
    tier: str
    #: Tokens the hit covers.
    tokens: int
    #: Bytes a restore of those tokens moves.
    nbytes: int


@dataclass(frozen=True)
class BatchHit:
    """One request's hit in one tier, for ``decide_batch``."""

    #: Tokens before the hit (the engine's own cache and earlier tiers).
    cached_tokens: int
    #: Tokens the hit covers.
    tokens: int
    #: Bytes a restore of those tokens moves.
    nbytes: int


@dataclass(frozen=True)
class Decision:
    """What to do with a chain of hits: restore the hits of ``restore_tiers``, recompute the rest.

    ``restore_tokens`` is a prefix of the chain: the hits of the first ``len(restore_tiers)``
    tiers. Times are predictions in seconds.
    """

    restore_tokens: int
    restore_tiers: tuple[str, ...]
    #: Predicted time to restore every hit of the chain.
    restore_s: float
    #: Predicted time to recompute every hit token instead.
    recompute_s: float
    #: Predicted cost of the chosen plan (restores + recompute of the rest).
    plan_s: float
    #: "restore is faster", "recompute is faster", "decision off" or "no hit".
    reason: str
    #: Seconds of decided prefill already queued on the engine when this was decided.
    engine_wait_s: float = 0.0
    #: The factor the restore's prediction had to beat recompute's by (``_factor``); 1.0
    #: where nothing was weighed.
    margin: float = 1.0
    #: The predicted seconds the plan puts on each resource (``ENGINE`` or a tier's name), in
    #: the backlog once the adapter carries it out (``RestorePolicy.commit``).
    charges: tuple[tuple[str, float], ...] = ()

    @property
    def restore(self) -> bool:
        return self.restore_tokens > 0


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


@dataclass(frozen=True)
class PolicySnapshot:
    """Everything the policy believes at one moment (for metrics and logs)."""

    enabled: bool
    prefill: PrefillCoefficients
    prefill_evidence: float
    tiers: dict[str, TierSnapshot]


@dataclass(frozen=True)
class PolicyEvidence:
    """The measurements behind a policy's models, oldest first (``evidence`` / ``adopt``)."""

    #: The prefill model's last measured steps.
    prefill_steps: tuple[MeasuredStep, ...]
    #: Each measured tier's last loads, by tier name (tiers never measured are left out).
    tier_loads: dict[str, tuple[MeasuredLoad, ...]]
    #: Measurements entered since the policy was made (adopted ones too); only grows, so a
    #: keeper can tell whether anything is new since it last saved.
    measurements: int = 0


@dataclass(frozen=True)
class AdoptedEvidence:
    """What ``adopt`` replayed."""

    #: Prefill steps used (a step the model ignores, e.g. decode-sized, is not counted).
    prefill_steps: int
    #: Loads replayed per tier; tiers this policy does not have are left out.
    tier_loads: dict[str, int]


class RestorePolicy:
    """Decides restore vs recompute per hit, and times loads against deadlines.

    Call order for an adapter (see docs/gpu-evidence.md for the wiring):

    1. ``add_tier(name, prior)`` once per tier at start-up (optionally
       ``calibrate_prefill(samples)``).
    2. After every engine step that computed prompt tokens:
       ``observe_prefill([(cached, new), ...], seconds)``.
    3. At lookup: ``decide(tier, cached_tokens, hit_tokens, hit_bytes)`` (or
       ``decide_chain``); report only ``decision.restore_tokens`` as hit.
    4. For each load submitted: ``ticket = begin_load(tier, nbytes)``; while polling jobs,
       ``overdue(ticket)`` -> abandon the job (its blocks are misses) and
       ``abandon_load(ticket)``; on completion ``end_load(ticket)`` (also after an abandon,
       when the I/O finally returns: its true time is evidence too).
    5. Now and then (e.g. the tier's poll): if ``probe_due(tier)``, read a stored record on
       the tier's own thread, off any request's path, and ``observe_load(tier, n, s)``.
    """

    def __init__(
        self,
        settings: PolicySettings | None = None,
        prefill: PrefillModel | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.settings = settings if settings is not None else PolicySettings()
        self.prefill = prefill if prefill is not None else PrefillModel()
        self._clock = clock
        self._lock = threading.Lock()
        self._tiers: dict[str, TierEstimate] = {}
        #: Tier whose copy a tier's restores also pass through (disk -> host pool -> engine).
        self._via: dict[str, str | None] = {}
        #: Whether a tier is writing now (``add_tier``), or None where it cannot tell.
        self._writing: dict[str, Callable[[], bool] | None] = {}
        #: Policy-clock time of each tier's last measurement or claimed probe.
        self._last_evidence_s: dict[str, float] = {}
        #: Work already decided, per resource (requests in flight; see the module docstring).
        self._backlog = Backlog()
        #: Each tier's loads begun and not ended (their I/O queues ahead of a new load's).
        self._running: dict[str, set[LoadTicket]] = {}

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
        (``_factor``); None: never.
        """
        s = self.settings
        with self._lock:
            if name in self._tiers:
                raise ConfigError(f"policy: tier {name!r} added twice; give each tier one name")
            if via is not None and via not in self._tiers:
                raise ConfigError(
                    f"policy: tier {name!r} via={via!r}, which is not a tier yet; add it first"
                )
            self._via[name] = via
            self._writing[name] = writing
            self._tiers[name] = TierEstimate(
                name,
                prior,
                prior_weight=s.prior_weight,
                half_life_loads=s.half_life_loads,
                slow_inflation=s.slow_inflation,
                slow_inflation_max=s.slow_inflation_max,
                recovery_loads=s.recovery_loads,
            )
            self._last_evidence_s[name] = -math.inf
            self._running[name] = set()

    def calibrate_prefill(self, samples: Iterable[tuple[int, int, float]]) -> PrefillCoefficients:
        """Seed the prefill model from ``(cached, new, seconds)`` calibration prompts."""
        with self._lock:
            return self.prefill.calibrate(list(samples))

    # -- evidence -------------------------------------------------------------------------

    def observe_prefill(self, segments: Sequence[tuple[int, int]], seconds: float) -> bool:
        """One engine step computed these ``(cached, new)`` segments in ``seconds``."""
        with self._lock:
            return self.prefill.observe_step(segments, seconds)

    def observe_load(self, tier: str, nbytes: int, seconds: float) -> bool:
        """A load or probe without a ticket took ``seconds``; True if within its deadline."""
        with self._lock:
            est = self._tier(tier)
            on_time = seconds <= self.settings.deadline.deadline_s(est.base_seconds(nbytes))
            est.observe(nbytes, seconds, on_time)
            self._last_evidence_s[tier] = self._clock()
            return on_time

    def probe_due(self, tier: str) -> bool:
        """Whether the adapter should probe ``tier`` now (and this call claims the probe).

        Due for a tier that is slow or was never measured, once per ``probe_interval_s``:
        the only way a refused tier can show that it recovered.
        """
        with self._lock:
            est = self._tier(tier)
            now = self._clock()
            if not (est.slow or est.loads == 0):
                return False
            if now - self._last_evidence_s[tier] < self.settings.probe_interval_s:
                return False
            self._last_evidence_s[tier] = now
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
        """The best prefix of a chain of tier hits to restore (see the module docstring).

        ``count=False``: a look-ahead, not a verdict (refusals are not counted in the
        tiers' ``refused``). ``queued=False``: weigh the request as if the engine and the
        tiers were idle (the backlog of decided work left out). The adapter passes the
        chosen plan to ``commit`` once it carries it out.
        """
        if cached_tokens < 0:
            raise ValueError(f"policy: cached_tokens={cached_tokens} must be >= 0")
        for hit in hits:
            if hit.tokens < 0 or hit.nbytes < 0:
                raise ValueError(f"policy: {hit} has a negative size")
        hits = [h for h in hits if h.tokens > 0]
        total = sum(h.tokens for h in hits)
        with self._lock:
            estimates = [self._tier(h.tier) for h in hits]
            restore = [self._predict(h.tier, h.nbytes) for h in hits]
            recompute_all = self.prefill.recompute_seconds(cached_tokens, total)
            if not hits:
                return Decision(0, (), 0.0, 0.0, 0.0, "no hit")
            if not self.settings.enabled:
                plan = sum(restore)
                tiers = tuple(h.tier for h in hits)
                return Decision(total, tiers, plan, recompute_all, plan, "decision off")
            now = self._clock()
            engine_wait = self._backlog.wait_s(ENGINE, now) if queued else 0.0
            # plan j: restore the first j hits, recompute the rest; each costs the time at
            # which it would finish (module docstring, "Requests in flight").
            best_j, best_cost, best_plan = 0, engine_wait + recompute_all, recompute_all
            best_rest, margin = recompute_all, 1.0
            context_end = cached_tokens + total
            restored_tokens, restored_s, reached = 0, 0.0, engine_wait
            for j, hit in enumerate(hits, start=1):
                restored_tokens += hit.tokens
                restored_s += restore[j - 1]
                if queued:
                    reached = max(reached, self._backlog.wait_s(hit.tier, now))
                # What a restore saves is the recompute of its own tokens. Weighed on those
                # alone, a prediction that is not linear (the prefill split unknown) stays
                # low, so it can never tip a verdict towards restoring.
                saved = self.prefill.recompute_seconds(cached_tokens, restored_tokens)
                rest = max(recompute_all - saved, 0.0)
                factor = self._factor(((h.tier, h.nbytes) for h in hits[:j]), context_end)
                margin = max(margin, factor)
                cost = reached + factor * restored_s + rest
                if cost < best_cost:
                    best_j, best_cost, best_plan, best_rest = j, cost, restored_s + rest, rest
            for est in estimates[best_j:] if count else ():
                est.refused += 1
        chosen = hits[:best_j]
        charges = [(h.tier, seconds) for h, seconds in zip(chosen, restore, strict=False)]
        if best_rest > 0:
            charges.append((ENGINE, best_rest))
        return Decision(
            restore_tokens=sum(h.tokens for h in chosen),
            restore_tiers=tuple(h.tier for h in chosen),
            restore_s=sum(restore),
            recompute_s=recompute_all,
            plan_s=best_plan,
            reason="restore is faster" if best_j else "recompute is faster",
            engine_wait_s=engine_wait,
            charges=tuple(charges),
            margin=margin,
        )

    def decide_batch(self, tier: str, hits: Sequence[BatchHit]) -> list[Decision]:
        """Verdicts for requests looked up in one scheduler step, in the scheduler's order:
        restore the first ``m`` and any whose restore pays alone, recompute the others, with
        the ``m`` that finishes the whole batch first (module docstring, "Requests in
        flight"). One ``Decision`` per hit, each to be passed to ``commit``."""
        for hit in hits:
            if hit.cached_tokens < 0 or hit.tokens <= 0 or hit.nbytes < 0:
                raise ValueError(f"policy: {hit} needs cached >= 0, tokens > 0, bytes >= 0")
        if len(hits) <= 1 or not self.settings.enabled:
            return [self.decide(tier, h.cached_tokens, h.tokens, h.nbytes) for h in hits]
        s = self.settings.safety_factor
        with self._lock:
            est = self._tier(tier)
            now = self._clock()
            engine_wait = self._backlog.wait_s(ENGINE, now)
            reached = max(engine_wait, self._backlog.wait_s(tier, now))
            restore = [self._predict(tier, h.nbytes) for h in hits]
            recompute = [self.prefill.recompute_seconds(h.cached_tokens, h.tokens) for h in hits]
            factors = [self._factor([(tier, h.nbytes)], h.cached_tokens + h.tokens) for h in hits]
            pays = [f * r < c for f, r, c in zip(factors, restore, recompute, strict=True)]

            def done_s(m: int) -> float:
                chosen = [i < m or pays[i] for i in range(len(hits))]
                loads = sum(r for r, c in zip(restore, chosen, strict=True) if c)
                prefills = sum(t for t, c in zip(recompute, chosen, strict=True) if not c)
                return max(reached + s * loads if loads else 0.0, engine_wait + prefills)

            # Restores beyond those that pay alone must also finish the batch sooner by the
            # safety factor: overlap is a second prediction on top of the load times, and loads
            # under concurrency run slower than alone (docs/benchmarks.md, "Requests in
            # flight"). The margin is on the batch's own time: the engine's queue delays every
            # plan alike.
            alone_s = done_s(0) - engine_wait
            best_m = min(range(len(hits) + 1), key=lambda m: (done_s(m), m))
            if s * (done_s(best_m) - engine_wait) >= alone_s:
                best_m = 0
            verdicts = [i < best_m or pays[i] for i in range(len(hits))]
            est.refused += sum(1 for v in verdicts if not v)
        return [
            Decision(
                restore_tokens=h.tokens if v else 0,
                restore_tiers=(tier,) if v else (),
                restore_s=r,
                recompute_s=c,
                plan_s=r if v else c,
                reason=(
                    "restore is faster"
                    if p
                    else "restore beside the engine's queue"
                    if v
                    else "recompute is faster"
                ),
                engine_wait_s=engine_wait,
                charges=((tier, r),) if v else ((ENGINE, c),),
                margin=f if p or not v else s,
            )
            for h, v, p, r, c, f in zip(
                hits, verdicts, pays, restore, recompute, factors, strict=True
            )
        ]

    def refuse_every_hit(
        self, tier: str, max_tokens: int, block_tokens: int, block_bytes: int
    ) -> Decision | None:
        """A recompute verdict that holds for any hit of ``tier`` in a prompt of at most
        ``max_tokens`` tokens, wherever it starts and however long it is; None if some hit
        could pay, or while prefill is queued on the engine (then a restore beside the queue
        may pay: ``decide_batch``). For an adapter that must answer before it knows the hit's
        size or position.

        Why one comparison covers every hit: per token, a restore costs least when it is the
        longest hit there can be (its fixed latency spread over the most tokens), and a
        recompute costs most at the prompt's last token (``PrefillModel.most_seconds_per_
        token``). If even that restore, by the safety factor, does not beat that recompute,
        no hit can. The factor is the smallest any hit can be held to (one block's, within
        the evidence where the tier has measured loads). Only one block is charged to the
        engine: the hit's size is unknown.
        """
        if not self.settings.enabled or max_tokens <= 0 or block_tokens <= 0:
            return None
        blocks = max(max_tokens // block_tokens, 1)
        with self._lock:
            est = self._tier(tier)
            if self._backlog.wait_s(ENGINE, self._clock()) > 0:
                return None
            longest_s = self._predict(tier, blocks * block_bytes)
            restore_per_token = longest_s / (blocks * block_tokens)
            recompute_per_token = self.prefill.most_seconds_per_token(max_tokens)
            factor = self._factor([(tier, block_bytes)], block_tokens)
            if factor * restore_per_token < recompute_per_token:
                return None
            est.refused += 1
            block_s = self._predict(tier, block_bytes)
            block_recompute = self.prefill.recompute_seconds(0, block_tokens)
        return Decision(
            restore_tokens=0,
            restore_tiers=(),
            restore_s=block_s,
            recompute_s=block_recompute,
            plan_s=block_recompute,
            reason="recompute is faster at any length",
            charges=((ENGINE, block_recompute),),
            margin=factor,
        )

    def commit(self, decision: Decision) -> None:
        """The adapter carries ``decision`` out: its work joins the backlog that later
        decisions weigh (requests in flight; a decision never committed is a look-ahead)."""
        with self._lock:
            now = self._clock()
            for resource, seconds in decision.charges:
                self._backlog.charge(resource, seconds, now)

    def engine_wait_s(self) -> float:
        """Seconds of decided prefill still queued on the engine (0 when idle)."""
        with self._lock:
            return self._backlog.wait_s(ENGINE, self._clock())

    # -- deadlines ------------------------------------------------------------------------

    def begin_load(self, tier: str, nbytes: int) -> LoadTicket:
        """Start the clock on a load of ``nbytes`` from ``tier``; its deadline is fixed now.

        The deadline uses the tier's unslowed estimate: a slow tier is held to the normal
        standard, so it recovers only by really meeting it. It covers the bytes of the
        tier's loads still running too: this load's reads queue behind theirs, and a
        restore chosen behind a queue (``commit``) must not be abandoned for waiting.
        """
        with self._lock:
            est = self._tier(tier)
            ahead = tuple(t for t in self._running[tier] if not t.abandoned)
            predicted = est.base_seconds(nbytes)
            queued_s = est.base_seconds(nbytes + sum(t.nbytes for t in ahead))
            deadline = self.settings.deadline.deadline_s(queued_s)
            ticket = LoadTicket(tier, nbytes, self._clock(), predicted, deadline, ahead)
            self._running[tier].add(ticket)
            return ticket

    def overdue(self, ticket: LoadTicket) -> bool:
        """True once a running load has passed its deadline (the adapter then abandons it)."""
        if ticket.done or ticket.abandoned:
            return False
        return self._clock() > ticket.deadline_at_s

    def abandon_load(self, ticket: LoadTicket) -> None:
        """The adapter gave up on the load (blocks become misses): mark the tier slow.

        Idempotent. The adapter must not reuse the load's buffers until its I/O returns; it
        then calls ``end_load``, whose (late) time also enters the estimate.
        """
        with self._lock:
            if ticket.abandoned or ticket.done:
                return
            ticket.abandoned = True
            # No longer ahead of anyone: its unstarted reads are skipped (and the adapter
            # may never end it if its I/O does not return).
            self._running[ticket.tier].discard(ticket)
            ticket.ahead = ()
            now = self._clock()
            self._tier(ticket.tier).overrun(ticket.nbytes, now - ticket.started_s)
            self._last_evidence_s[ticket.tier] = now

    def end_load(self, ticket: LoadTicket) -> bool:
        """The load's I/O completed; returns True if it was on time.

        A load that completed late but was not abandoned counts as an overrun (the data is
        still good to use). After ``abandon_load`` the true time only refines the estimate.
        """
        with self._lock:
            if ticket.done:
                return False
            ticket.done = True
            now = self._clock()
            ticket.ended_s = now
            self._running[ticket.tier].discard(ticket)
            elapsed = now - ticket.started_s
            service = now - self._service_start_s(ticket)
            est = self._tier(ticket.tier)
            self._last_evidence_s[ticket.tier] = now
            if ticket.abandoned:
                est.record(ticket.nbytes, service)
                return False
            on_time = elapsed <= ticket.deadline_s
            est.observe(ticket.nbytes, service, on_time)
            return on_time

    @staticmethod
    def _service_start_s(ticket: LoadTicket) -> float:
        """When the tier began on ``ticket``'s reads: at its submission, or when the last of
        the loads queued ahead of it ended. The estimate learns a load's own time, not its
        wait, which the backlog accounts for; else eight loads at once would teach it a
        tier eight times slower than it is."""
        ends = [t.ended_s for t in ticket.ahead if t.ended_s is not None]
        ticket.ahead = ()  # a chain of tickets must not keep every earlier one alive
        return max([ticket.started_s, *ends])

    # -- evidence of an earlier process ---------------------------------------------------

    def evidence(self) -> PolicyEvidence:
        """The measurements behind the models now (a copy; cheap: a few dozen tuples)."""
        with self._lock:
            loads = {n: est.recent_loads() for n, est in self._tiers.items() if est.measured}
            return PolicyEvidence(
                prefill_steps=self.prefill.recent_steps(),
                tier_loads={n: v for n, v in loads.items() if v},
                measurements=self.prefill.observed
                + sum(est.measured for est in self._tiers.values()),
            )

    def adopt(self, evidence: PolicyEvidence) -> AdoptedEvidence:
        """Replay an earlier process's measurements, oldest first, as if measured now.

        Loads of a tier this policy does not have are skipped. Slow marks are not touched:
        a replayed load counts towards the fit and the throughput shown, not a deadline.
        """
        with self._lock:
            steps = sum(
                self.prefill.observe_step(step.segments, step.seconds)
                for step in evidence.prefill_steps
            )
            loads: dict[str, int] = {}
            for name, measured in evidence.tier_loads.items():
                est = self._tiers.get(name)
                if est is None or not measured:
                    continue
                for load in measured:
                    est.record(load.nbytes, load.seconds)
                loads[name] = len(measured)
            return AdoptedEvidence(steps, loads)

    # -- introspection --------------------------------------------------------------------

    def predict_restore_s(self, tier: str, nbytes: int) -> float:
        """Predicted seconds to restore ``nbytes`` from ``tier`` (slow marks and ``via`` too)."""
        with self._lock:
            return self._predict(tier, nbytes)

    def predict_recompute_s(self, cached_tokens: int, tokens: int) -> float:
        """Predicted seconds for the engine to compute ``tokens`` after ``cached_tokens``."""
        with self._lock:
            return self.prefill.recompute_seconds(cached_tokens, tokens)

    def _factor(self, loads: Iterable[tuple[str, int]], context_end: int) -> float:
        """How much faster than recompute a restore of these ``(tier, bytes)`` loads must be
        predicted, for a prompt of ``context_end`` tokens (module docstring, "Safety"):
        ``safety_factor_within_evidence`` when every prediction involved interpolates
        measurements and no tier loaded from is writing, else ``safety_factor``."""
        s = self.settings
        if context_end > self.prefill.reach_tokens:
            return s.safety_factor
        for tier, nbytes in loads:
            if nbytes > self._tier(tier).largest_load_bytes:
                return s.safety_factor
            writing = self._writing[tier]
            if writing is not None and writing():
                return s.safety_factor
            via = self._via[tier]
            while via is not None:
                # A via tier nothing measures (the host pool's copy to the GPU on CUDA) is
                # predicted by its prior, which errs slow: it can only cost a missed gain.
                largest = self._tier(via).largest_load_bytes
                if 0 < largest < nbytes:
                    return s.safety_factor
                via = self._via[via]
        return min(s.safety_factor_within_evidence, s.safety_factor)

    def _predict(self, tier: str, nbytes: int) -> float:
        seconds = self._tier(tier).predict_seconds(nbytes)
        via = self._via[tier]
        return seconds + (self._predict(via, nbytes) if via is not None else 0.0)

    def snapshot(self) -> PolicySnapshot:
        with self._lock:
            return PolicySnapshot(
                enabled=self.settings.enabled,
                prefill=self.prefill.coefficients(),
                prefill_evidence=self.prefill.evidence,
                tiers={name: est.snapshot() for name, est in self._tiers.items()},
            )

    def _tier(self, name: str) -> TierEstimate:
        try:
            return self._tiers[name]
        except KeyError:
            known = sorted(self._tiers)
            raise ConfigError(
                f"policy: unknown tier {name!r}; known: {known}; call add_tier first"
            ) from None
