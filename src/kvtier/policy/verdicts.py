"""Restore or recompute: the verdicts, as pure functions of the models and the backlog.

Invariant 9 (docs/architecture.md): a tier's hit is restored only when its predicted restore
time beats recomputing the same tokens. Each function here reads the tiers' estimates
(``TierChain``), the engine's prefill model and the work already queued (``wait_s``: seconds
ahead on a resource, ``ENGINE`` or a tier's name) and returns its verdicts with the tiers it
refused; ``RestorePolicy`` holds the state, the lock and the counts.

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
  measurements (``TierChain.margin``): the hit no larger than the tier's recent loads, nor than its
  ``via`` tier's, the prompt no longer than the longest the prefill model was measured
  on, and no tier loaded from writing now (a load that shares the disk with write-back took
  1.14-1.49x the same load alone in the GPU runs: docs/benchmarks.md). Within the evidence
  the models come within a few percent (once prefill is timed to the step that computed
  it) and a missed gain should cost at most 5 %; beyond it they extrapolate, and there a
  fixed 1.2 refused every restore that was slower, where 1.05 took one 1.41x slower (the
  offline cells of docs/gpu-evidence.md). The margin a batch's overlap must beat
  is ``safety_factor``: the overlap is a prediction nothing measures.
* Priors err towards refusing: a tier is assumed slow and prefill fast until measured.
* Every load gets a deadline (``DeadlineRule``); an overrun abandons the load (its blocks
  become misses), marks the tier slow (predictions inflated) and feeds the elapsed time into
  the estimate. A slow tier recovers after ``recovery_loads`` consecutive on-time loads or
  background probes (``probe_due``): fresh measurements, not time alone.
* ``enabled=False`` turns the decision off: every hit is restored; deadlines still apply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kvtier.policy.backlog import ENGINE
from kvtier.policy.prefill import PrefillModel
from kvtier.policy.settings import PolicySettings
from kvtier.policy.tier_chain import TierChain

#: Seconds of decided work still ahead on a resource (``ENGINE`` or a tier's name).
WaitS = Callable[[str], float]


def idle(_resource: str) -> float:
    """``WaitS`` of an engine and tiers with nothing queued."""
    return 0.0


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
    #: The factor the restore's prediction had to beat recompute's by
    #: (``TierChain.margin``); 1.0 where nothing was weighed.
    margin: float = 1.0
    #: The predicted seconds the plan puts on each resource (``ENGINE`` or a tier's name), in
    #: the backlog once the adapter carries it out (``RestorePolicy.commit``).
    charges: tuple[tuple[str, float], ...] = ()

    @property
    def restore(self) -> bool:
        return self.restore_tokens > 0


def decide_chain(
    chain: TierChain,
    prefill: PrefillModel,
    settings: PolicySettings,
    cached_tokens: int,
    hits: Sequence[TierHit],
    wait_s: WaitS,
) -> tuple[Decision, tuple[str, ...]]:
    """The best prefix of a chain of tier hits to restore (module docstring), and the tiers
    whose hits it refused."""
    if cached_tokens < 0:
        raise ValueError(f"policy: cached_tokens={cached_tokens} must be >= 0")
    for hit in hits:
        if hit.tokens < 0 or hit.nbytes < 0:
            raise ValueError(f"policy: {hit} has a negative size")
    hits = [h for h in hits if h.tokens > 0]
    total = sum(h.tokens for h in hits)
    restore = [chain.predict_s(h.tier, h.nbytes) for h in hits]
    recompute_all = prefill.recompute_seconds(cached_tokens, total)
    if not hits:
        return Decision(0, (), 0.0, 0.0, 0.0, "no hit"), ()
    if not settings.enabled:
        plan = sum(restore)
        tiers = tuple(h.tier for h in hits)
        return Decision(total, tiers, plan, recompute_all, plan, "decision off"), ()
    engine_wait = wait_s(ENGINE)
    # plan j: restore the first j hits, recompute the rest; each costs the time at which it
    # would finish (module docstring, "Requests in flight").
    best_j, best_cost, best_plan = 0, engine_wait + recompute_all, recompute_all
    best_rest, margin = recompute_all, 1.0
    context_end = cached_tokens + total
    restored_tokens, restored_s, reached = 0, 0.0, engine_wait
    for j, hit in enumerate(hits, start=1):
        restored_tokens += hit.tokens
        restored_s += restore[j - 1]
        reached = max(reached, wait_s(hit.tier))
        # What a restore saves is the recompute of its own tokens. Weighed on those alone, a
        # prediction that is not linear (the prefill split unknown) stays low, so it can
        # never tip a verdict towards restoring.
        saved = prefill.recompute_seconds(cached_tokens, restored_tokens)
        rest = max(recompute_all - saved, 0.0)
        factor = chain.margin(
            ((h.tier, h.nbytes) for h in hits[:j]), context_end, prefill.reach_tokens
        )
        margin = max(margin, factor)
        cost = reached + factor * restored_s + rest
        if cost < best_cost:
            best_j, best_cost, best_plan, best_rest = j, cost, restored_s + rest, rest
    chosen = hits[:best_j]
    charges = [(h.tier, seconds) for h, seconds in zip(chosen, restore, strict=False)]
    if best_rest > 0:
        charges.append((ENGINE, best_rest))
    decision = Decision(
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
    return decision, tuple(h.tier for h in hits[best_j:])


def check_batch(hits: Sequence[BatchHit]) -> None:
    """``ValueError`` for a batch hit of no size or a negative one."""
    for hit in hits:
        if hit.cached_tokens < 0 or hit.tokens <= 0 or hit.nbytes < 0:
            raise ValueError(f"policy: {hit} needs cached >= 0, tokens > 0, bytes >= 0")


def decide_batch(
    chain: TierChain,
    prefill: PrefillModel,
    settings: PolicySettings,
    tier: str,
    hits: Sequence[BatchHit],
    wait_s: WaitS,
) -> list[Decision]:
    """Verdicts for two or more requests looked up in one scheduler step, in the scheduler's
    order, with the decision on: restore the first ``m`` and any whose restore pays alone,
    recompute the others, with the ``m`` that finishes the whole batch first (module
    docstring, "Requests in flight")."""
    check_batch(hits)
    s = settings.safety_factor
    chain.estimate(tier)  # an unknown tier is refused
    engine_wait = wait_s(ENGINE)
    reached = max(engine_wait, wait_s(tier))
    restore = [chain.predict_s(tier, h.nbytes) for h in hits]
    recompute = [prefill.recompute_seconds(h.cached_tokens, h.tokens) for h in hits]
    factors = [
        chain.margin([(tier, h.nbytes)], h.cached_tokens + h.tokens, prefill.reach_tokens)
        for h in hits
    ]
    pays = [f * r < c for f, r, c in zip(factors, restore, recompute, strict=True)]

    def done_s(m: int) -> float:
        chosen = [i < m or pays[i] for i in range(len(hits))]
        loads = sum(r for r, c in zip(restore, chosen, strict=True) if c)
        prefills = sum(t for t, c in zip(recompute, chosen, strict=True) if not c)
        return max(reached + s * loads if loads else 0.0, engine_wait + prefills)

    # Restores beyond those that pay alone must also finish the batch sooner by the safety
    # factor: overlap is a second prediction on top of the load times, and loads under
    # concurrency run slower than alone (docs/benchmarks.md, "Requests in flight"). The
    # margin is on the batch's own time: the engine's queue delays every plan alike.
    alone_s = done_s(0) - engine_wait
    best_m = min(range(len(hits) + 1), key=lambda m: (done_s(m), m))
    if s * (done_s(best_m) - engine_wait) >= alone_s:
        best_m = 0
    verdicts = [i < best_m or pays[i] for i in range(len(hits))]
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
        for h, v, p, r, c, f in zip(hits, verdicts, pays, restore, recompute, factors, strict=True)
    ]


def refuse_every_hit(
    chain: TierChain,
    prefill: PrefillModel,
    tier: str,
    max_tokens: int,
    block_tokens: int,
    block_bytes: int,
    wait_s: WaitS,
) -> Decision | None:
    """A recompute verdict that holds for any hit of ``tier`` in a prompt of at most
    ``max_tokens`` tokens, wherever it starts and however long it is; None if some hit could
    pay, or while prefill is queued on the engine (then a restore beside the queue may pay:
    ``decide_batch``). For an adapter that must answer before it knows the hit's size or
    position; the decision on.

    Why one comparison covers every hit: per token, a restore costs least when it is the
    longest hit there can be (its fixed latency spread over the most tokens), and a recompute
    costs most at the prompt's last token (``PrefillModel.most_seconds_per_token``). If even
    that restore, by the safety factor, does not beat that recompute, no hit can. The factor
    is the smallest any hit can be held to (one block's, within the evidence where the tier
    has measured loads). Only one block is charged to the engine: the hit's size is unknown.
    """
    if max_tokens <= 0 or block_tokens <= 0:
        return None
    chain.estimate(tier)  # an unknown tier is refused
    if wait_s(ENGINE) > 0:
        return None
    restore_per_token, recompute_per_token = _per_token_at_most(
        chain, prefill, tier, max_tokens, block_tokens, block_bytes, slow_mark=True
    )
    factor = chain.margin([(tier, block_bytes)], block_tokens, prefill.reach_tokens)
    if factor * restore_per_token < recompute_per_token:
        return None
    block_s = chain.predict_s(tier, block_bytes)
    block_recompute = prefill.recompute_seconds(0, block_tokens)
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


def never_pays(
    chain: TierChain,
    prefill: PrefillModel,
    settings: PolicySettings,
    tier: str,
    max_tokens: int,
    block_tokens: int,
    block_bytes: int,
) -> bool:
    """Whether no hit of ``tier`` could be restored in a prompt of at most ``max_tokens``
    tokens with the engine idle, judged as ``refuse_every_hit`` judges (the longest hit's
    restore per token against the last token's recompute) but on the tier's measured speed
    without its slow mark and under the most lenient factor any verdict uses. For the tier's
    writes (``kvtier.policy.write_admission``): neither a passing slow mark nor whether the
    tier is writing (which moves ``TierChain.margin``) changes the answer."""
    if max_tokens <= 0 or block_tokens <= 0:
        return False
    restore_per_token, recompute_per_token = _per_token_at_most(
        chain, prefill, tier, max_tokens, block_tokens, block_bytes, slow_mark=False
    )
    factor = min(settings.safety_factor_within_evidence, settings.safety_factor)
    return factor * restore_per_token >= recompute_per_token


def _per_token_at_most(
    chain: TierChain,
    prefill: PrefillModel,
    tier: str,
    max_tokens: int,
    block_tokens: int,
    block_bytes: int,
    *,
    slow_mark: bool,
) -> tuple[float, float]:
    """Seconds per token of the cheapest restore of ``tier`` in a prompt of at most
    ``max_tokens`` (the longest hit) and of the dearest recompute (the last token)."""
    blocks = max(max_tokens // block_tokens, 1)
    longest_s = chain.predict_s(tier, blocks * block_bytes, slow_mark=slow_mark)
    return longest_s / (blocks * block_tokens), prefill.most_seconds_per_token(max_tokens)
