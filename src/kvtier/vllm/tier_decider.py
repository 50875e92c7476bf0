"""Restore or recompute, per request: vLLM's per-key lookups meet ``kvtier.policy``.

vLLM asks a tier about one key at a time and keeps scanning a request's keys when a tier
answers RETRY. The policy decides per request and per tier, all or nothing (the argument is in
``kvtier.policy.verdicts``). So, with the decision on and the engine's prefill measured:

1. At the request's first key that hits this tier, the tier looks ahead: vLLM records every
   key's end position in the request context before the lookups start, so the run of
   consecutive keys this tier holds from that key on is known at once (the tier's
   ``holds``: its in-memory index, no I/O). That run is the most this tier can restore and is
   decided whole, at once: restore (HIT), or, for a tier that knows all it holds (the disk),
   recompute (MISS). No scheduler step is lost either way.
2. Failing that (no positions recorded, or a tier that must ask a server about keys it has
   not seen, whose run may be longer than it knows), the first key is weighed alone: if
   restoring that one block beats recomputing it, the whole hit is restored (restoring costs
   the same per token wherever the token sits and recomputing costs more the later it sits,
   so every later block wins by at least as much; ``kvtier.policy.verdicts``). The same
   argument makes the look-ahead safe: if a shorter run pays, a longer one pays more.
   Conversely, with nothing queued on the engine, if no hit could pay in any prompt the
   engine takes (its ``max_model_len``: the longest hit restored against the prompt's last
   token recomputed, ``RestorePolicy.refuse_every_hit``), the first key answers MISS: a
   request alone does not wait a step for a verdict that cannot go the other way. Not for a
   request that may be part of a burst, though: its batch (case 3) can restore the burst's
   front while the engine prefills the rest. Refused at once one by one, each request would
   find the engine idle (a refusal charges it one block: the hit's size is unknown; and a
   request that waited behind a refused one is looked up only once that one's prefill step
   has run), so a burst would be recomputed whole where its batch restores the front
   beside the rest's prefill (docs/benchmarks.md, "Requests in flight"). So after a
   refusal the next ones are held off for twice the longest prefill the engine can run
   (``max_model_len`` tokens, predicted): a request looked up within that time may have
   waited behind it, and is collected instead, at the cost of one step.
3. Otherwise each hit key is answered RETRY and collected (with its end position), and at
   the end of that scheduler step (``on_schedule_end``) the whole hit is decided: tokens
   ``[M, M + N)`` with ``M`` = tokens before the first hit key, ``N`` = the hit keys' tokens,
   bytes = keys x row size. From the next step on every key of the request answers HIT
   (restore) or MISS (recompute).

The look-ahead can overrate a hit that vLLM then cuts short (a request's ``max_load_tokens``,
the step's token budget): the cut hit is restored though it might not pay alone; a deadline
still bounds it.

Requests in flight: every weighed verdict puts its predicted work on the policy's backlog (the
engine's prefill for a recompute, the tier for a restore). The requests collected in one step
(case 3) are decided together, in the order vLLM looked them up, its scheduling order
(``RestorePolicy.decide_batch``): with eight long prompts waiting and a disk slower than
prefill, the first few are restored, their loads starting at once, while the engine prefills
the others. The look-ahead (cases 1 and 2) decides a request alone, before the others of its
step are seen, so on vLLM 0.32 a refused hit is not batched: a batch needs the step that case
3 costs, which only vLLM 0.25.1 (no key positions) always pays. Verdicts ``off`` and
``unmeasured`` are not weighed and not charged.

A request can opt out: ``kv_transfer_params={"kvtier_restore_decision": false}`` restores its
hits whatever the policy predicts (verdict ``off``), as with the decision off server-wide
(``true``, the default, leaves it to the server's setting). Benchmarks use it to measure both
settings side by side in one engine, where engine-to-engine spread would otherwise swamp them.

Only case 3 costs a scheduler step (an idle step with a request waiting). Before the
engine's prefill cost has been
measured there is nothing to weigh a restore against: hits are restored at once (verdict
``unmeasured``), and the load deadline bounds what a slow tier can cost. A fresh engine whose
disk folder keeps an earlier process's measurements starts from those instead
(``kvtier.runtime.decision_memory``), so its first restores are weighed.

Prefill evidence comes from the engine's own work, seen from the scheduler: vLLM hands a
tier the blocks it has computed (store jobs, with their positions), so the time from a
request's last lookup to the end of the step that computed a job's blocks, and the tokens
stored by then, measure its prefill so far (not chunk by chunk: jobs arrive late and bunched,
see ``on_store``). Where the spec keeps the scheduler's step times (``StepClock``: kvtier's
CUDA spec) the end is that step's; elsewhere it is the job's arrival, which while a prompt is
still prefilling comes a chunk or more after its blocks were computed
(``kvtier.runtime.step_clock``). Jobs of fewer than
``MIN_EVIDENCE_KEYS`` keys are skipped (decode-time blocks). With
several requests per step the time is shared and the fit leans towards slower prefill, i.e.
towards restoring; deadlines still bound a slow tier.

Where vLLM records no key positions and keeps no per-request state (``Release.has_key_positions``
false), the plan lives on the request context as an attribute, a request's stored blocks are counted
from its start (they reach the tier in order) and a hit is weighed as if it began the prompt (``M``
= 0). Both err the same small way for a request that had a prefix hit: its prefill evidence reads a
little slow (towards restoring) and its recompute estimate a little cheap (towards recomputing), so
the two partly cancel; steps 1 and 2 need positions and are skipped there, so every decided hit
costs the one step of case 3 unless the converse of step 2 refuses it at once (which needs only
``max_model_len``). ``prefill_evidence`` says which applies, in the engine's start-up line.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext

from kvtier.policy import MIN_PREFILL_EVIDENCE, BatchHit, Decision, RestorePolicy
from kvtier.policy.write_admission import WriteAdmission
from kvtier.runtime.step_clock import StepClock
from kvtier.vllm.release import Release, current

logger = logging.getLogger(__name__)


def prefill_evidence(release: Release) -> str:
    """How the decision learns the engine's prefill cost on ``release`` (start-up line)."""
    if release.has_key_positions:
        return "prefill timed from the engine's store jobs at vLLM's key positions"
    return (
        "prefill timed from the engine's store jobs; no key positions in this vLLM: "
        "blocks counted from each request's start, hits weighed as at the prompt's start"
    )


#: The ``kv_transfer_params`` key by which a request opts out of the decision (``false``).
REQUEST_DECISION_KEY = "kvtier_restore_decision"

#: Store jobs of fewer keys are decode-time blocks, not prefill chunks.
MIN_EVIDENCE_KEYS = 2
#: Store jobs kept for the shared-window evidence (``on_store``): no prefill window is longer
#: than a few minutes, and a window's jobs beyond the count are only left out (the fit then
#: reads that window slow, as it did before).
STORED_WINDOW_S = 300.0
STORED_KEPT = 4096
#: The prompt length at which the ``kvtier:prefill_seconds_per_token`` gauge states the
#: prefill cost (seconds per token of a cold prefill; it grows with length by attention).
GAUGE_PREFILL_TOKENS = 2048


@dataclass
class _Plan:
    """One request's hit in one tier (kept in vLLM's request context)."""

    keys: dict[OffloadKey, int] = field(default_factory=dict)
    verdict: bool | None = None
    #: Prefill evidence: where and when the request's prefill began (its first stored key's
    #: start, its last lookup), and the end of the last stored key.
    prefill_from: tuple[int, float | None] | None = None
    stored_end: int | None = None
    last_lookup: float | None = None
    #: Names the request in the decider's record of store jobs without keeping the plan (and
    #: its keys) alive there.
    serial: int = field(default_factory=lambda: next(_PLAN_SERIALS))


_PLAN_SERIALS = itertools.count()


@dataclass
class DecisionCounts:
    """How many requests' hits each verdict got (cumulative, for metrics)."""

    restore: int = 0
    recompute: int = 0
    unmeasured: int = 0
    off: int = 0


class TierDecider:
    """Per-request restore-or-recompute for one tier (scheduler thread, see module doc)."""

    def __init__(
        self,
        policy: RestorePolicy,
        tier: str,
        tokens_per_key: int,
        row_bytes: int,
        clock: Callable[[], float],
        observes_prefill: bool,
        release: Release | None = None,
        max_tokens: int | None = None,
        step_clock: StepClock | None = None,
        writes: WriteAdmission | None = None,
    ) -> None:
        """``release`` (default: the installed one): where its request context records
        every key's position (``has_key_positions``) the plan reads them; else kvtier counts
        positions itself (``prefill_evidence``). ``max_tokens``: the longest prompt the
        engine takes, where the tier cannot see a request's keys ahead; None where
        it can or where it is not known. ``step_clock``: when the engine computed each stored
        block (read only by the tier that ``observes_prefill``); None: a store job is timed
        to its arrival. ``writes``: the tier's store admission
        (``kvtier.policy.write_admission``); None: every store is written."""
        self.policy = policy
        self._step_clock = step_clock
        self._max_tokens = max_tokens
        self._release = current() if release is None else release
        self._native = self._release.has_key_positions
        self.tier = tier
        self.tokens_per_key = max(tokens_per_key, 1)
        self.row_bytes = row_bytes
        self.counts = DecisionCounts()
        self._clock = clock
        self._observes_prefill = observes_prefill
        self._pending: list[_Plan] = []
        #: Until this time no request is refused at its first key (``_no_hit_pays``).
        self._refusals_held_until = float("-inf")
        self._lock = threading.Lock()
        #: Recent store jobs (when, the plan's serial, tokens before them, tokens added), at most
        #: ``STORED_KEPT`` within ``STORED_WINDOW_S``: the work done beside a request's prefill.
        self._stored: deque[tuple[float, int, int, int]] = deque(maxlen=STORED_KEPT)
        self._warned_bad_param = False
        #: Whether a store job is worth writing, told of every restore verdict.
        self.writes = (
            writes
            if writes is not None
            else WriteAdmission(policy, tier, None, self.tokens_per_key, row_bytes, clock)
        )

    def _plan(self, ctx: ReqContext) -> _Plan:
        slot = self._release.get_request_state(ctx, _PlanSlot)
        if slot is None:
            slot = _PlanSlot()
            self._release.set_request_state(ctx, slot)
        return slot.by_tier.setdefault(self.tier, _Plan())

    def on_lookup(self, ctx: ReqContext) -> None:
        """Any lookup of the request (its prefill starts right after its last one)."""
        self._plan(ctx).last_lookup = self._clock()

    def hit(
        self,
        key: OffloadKey,
        ctx: ReqContext,
        holds: Callable[[OffloadKey], bool] | None = None,
        knows_all: bool = False,
    ) -> LookupResult:
        """The tier holds ``key``: HIT, MISS, or RETRY while the request is being decided.

        ``holds`` (whether the tier holds a key, from memory) enables the look-ahead;
        ``knows_all``: a key it does not hold is one it does not have (no server to ask), so
        a run that does not pay is recomputed at once.
        """
        plan = self._plan(ctx)
        if plan.verdict is not None:
            return LookupResult.HIT if plan.verdict else LookupResult.MISS
        if not self.policy.settings.enabled or not self._request_decides(ctx):
            self._settle(plan, True, "off")
            return LookupResult.HIT
        if self.policy.prefill.evidence < MIN_PREFILL_EVIDENCE:
            self._settle(plan, True, "unmeasured")
            return LookupResult.HIT
        position = self._release.key_position(ctx, key)
        if not plan.keys:
            run = None if holds is None else self._held_run(key, ctx, holds)
            if run is not None:
                cached, tokens, n_keys, ended = run
                complete = knows_all and ended
                decision = self.policy.decide(
                    self.tier, cached, tokens, n_keys * self.row_bytes, count=complete
                )
                if decision.restore:
                    self._settle(plan, True, "restore", decision)
                    return LookupResult.HIT
                if complete:
                    self._settle(plan, False, "recompute", decision)
                    return LookupResult.MISS
            elif position is not None and (block := self._one_block_pays(position)):
                self._settle(plan, True, "restore", block)
                return LookupResult.HIT
            elif (refusal := self._no_hit_pays()) is not None:
                self._settle(plan, False, "recompute", refusal)
                return LookupResult.MISS
            with self._lock:
                self._pending.append(plan)
        plan.keys[key] = position if position is not None else len(plan.keys)
        return LookupResult.RETRY

    def _request_decides(self, ctx: ReqContext) -> bool:
        """False when the request opted out (``REQUEST_DECISION_KEY``: false). Any value but
        a bool is ignored, with one warning: a bad parameter must not fail the request."""
        params = ctx.kv_transfer_params
        if not params or REQUEST_DECISION_KEY not in params:
            return True
        value = params[REQUEST_DECISION_KEY]
        if isinstance(value, bool):
            return value
        if not self._warned_bad_param:
            self._warned_bad_param = True
            logger.warning(
                "kvtier: kv_transfer_params[%r]=%r ignored (give true or false); "
                "the server's restore decision applies",
                REQUEST_DECISION_KEY,
                value,
            )
        return True

    def _held_run(
        self, key: OffloadKey, ctx: ReqContext, holds: Callable[[OffloadKey], bool]
    ) -> tuple[int, int, int, bool] | None:
        """The run of consecutive blocks this tier holds from ``key`` on: (tokens before it,
        tokens, keys, whether the run ended at a block not held or at the request's last
        recorded block); None without recorded positions.

        Reads the request's recorded key positions (``Release.key_positions``: every key of the
        request, recorded by vLLM's ``update_offload_keys`` before the lookups). A gap in the
        positions (a group with other spacing) ends the run as not ended: the rest is unknown, so
        the caller does not refuse on it.
        """
        positions = self._release.key_positions(ctx)
        if positions is None:
            return None
        start = positions.get(key)
        if start is None:
            return None
        by_end: dict[int, list[OffloadKey]] = {}
        for k, end in positions.items():
            if end >= start:
                by_end.setdefault(end, []).append(k)
        before = max(start - self.tokens_per_key, 0)
        reached, n_keys, ended = before, 0, True
        for end in sorted(by_end):
            if end != reached + self.tokens_per_key and n_keys:
                ended = False
                break
            if not all(holds(k) for k in by_end[end]):
                break
            n_keys += len(by_end[end])
            reached = end
        if n_keys == 0:
            return None
        return before, reached - before, n_keys, ended

    def _one_block_pays(self, end: int) -> Decision | None:
        """The decision to restore the one block ending at token ``end`` if that beats
        recomputing it (then the whole hit does: see the module docstring), else None.

        Weighed idle: the argument holds for one request alone, not behind a queue (a block
        that wins only by the engine's wait says nothing of the blocks after it). The whole
        hit's size is unknown here, so only the block is charged to the backlog."""
        cached = max(end - self.tokens_per_key, 0)
        decision = self.policy.decide(
            self.tier, cached, self.tokens_per_key, self.row_bytes, count=False, queued=False
        )
        return decision if decision.restore else None

    def _no_hit_pays(self) -> Decision | None:
        """The verdict to recompute at once when no hit of this tier could pay in any prompt
        the engine takes and nothing is queued on the engine (module docstring, step 2); None
        otherwise, or when the longest prompt is not known."""
        if self._max_tokens is None or self._pending:
            return None  # another request of this step is being collected: one batch
        now = self._clock()
        if now < self._refusals_held_until:
            return None  # may have waited behind the last one refused: a burst's batch
        refusal = self.policy.refuse_every_hit(
            self.tier, self._max_tokens, self.tokens_per_key, self.row_bytes
        )
        if refusal is not None:
            # The refused request's prefill runs for at most the longest prompt's (doubled for
            # the model's error and the decodes beside it); a request looked up by then may
            # have been waiting behind it.
            longest = self.policy.predict_recompute_s(0, self._max_tokens)
            self._refusals_held_until = now + 2 * longest
        return refusal

    def end_step(self) -> None:
        """Decide every request whose hits were collected this step."""
        with self._lock:
            pending, self._pending = self._pending, []
        plans = [plan for plan in pending if plan.verdict is None and plan.keys]
        hits = []
        for plan in plans:
            n_keys = len(plan.keys)
            cached = max(min(plan.keys.values()) - self.tokens_per_key, 0)
            hits.append(BatchHit(cached, n_keys * self.tokens_per_key, n_keys * self.row_bytes))
        if plans:
            logger.debug("kvtier: %s: %d request(s) decided in one step", self.tier, len(plans))
        # One batch: what the engine prefills and what the tier loads overlap (the policy's
        # "Requests in flight"); the plans are in the order the scheduler looked them up.
        for plan, decision in zip(plans, self.policy.decide_batch(self.tier, hits), strict=True):
            verdict = "restore" if decision.restore else "recompute"
            self._settle(plan, decision.restore, verdict, decision)

    def _settle(
        self, plan: _Plan, restore: bool, why: str, decision: Decision | None = None
    ) -> None:
        """Give the request its verdict; a weighed one's work joins the policy's backlog, so
        the requests decided after it see the engine's and the tier's queues."""
        plan.verdict = restore
        setattr(self.counts, why, getattr(self.counts, why) + 1)
        if why == "restore":
            self.writes.note_restore()
        if decision is not None:
            self.policy.commit(decision)
            # Why a verdict went as it did is otherwise invisible on a serving engine
            # (KVTIER_LOG_LEVEL=DEBUG): the predictions it weighed, and the queue it saw.
            logger.debug(
                "kvtier: %s: %s (%s): restore %.3f s, recompute %.3f s, plan %.3f s, "
                "engine queue %.3f s, margin %.2fx",
                self.tier,
                why,
                decision.reason,
                decision.restore_s,
                decision.recompute_s,
                decision.plan_s,
                decision.engine_wait_s,
                decision.margin,
            )

    def prefill_per_token_s(self) -> float:
        """Predicted seconds per token of a cold ``GAUGE_PREFILL_TOKENS`` prefill; 0 until
        prefill is measured. Not the fit's ``per_token_s`` alone: on a small model the fit can
        put all the cost into attention and step time, and the gauge read 0."""
        prefill = self.policy.prefill
        if prefill.evidence < MIN_PREFILL_EVIDENCE:
            return 0.0
        return prefill.recompute_seconds(0, GAUGE_PREFILL_TOKENS) / GAUGE_PREFILL_TOKENS

    def on_store(self, keys: list[OffloadKey], ctx: ReqContext) -> None:
        """vLLM stores blocks it just computed: measure the request's prefill so far.

        Each observation spans the request's whole prefill up to this job (from its last
        lookup, over every token stored since, to the end of the step that computed the job's
        blocks where the spec's ``StepClock`` knows it), not the chunk between two jobs: jobs
        reach a tier when the host pool cascades them, a step or more after the chunk was
        computed, so the jobs of a chunked prefill can arrive together at its end. Timed
        between jobs, a prompt of two chunks would read as one chunk in the whole prefill's
        time and the other in a few milliseconds, and the fit would then predict recompute
        far too cheap and refuse every restore of a fast disk.

        Requests prefilled while others are: the engine's time in the window was shared, so
        the other requests' tokens stored within it are counted as work done in it too
        (``_stored``). Without that, each of several prompts prefilled one after another reads
        as the prefills of all those before it, several times its own cost, and the decision
        then restores a whole batch from a disk slower than prefill.
        """
        if not self._observes_prefill or not keys:
            return
        now = self._clock()
        computed = None if self._step_clock is None else self._step_clock.computed_by(keys)
        if computed is not None:
            now = min(computed, now)  # the job arrived steps after the engine computed it
        plan = self._plan(ctx)
        if self._native:
            positions = [p for k in keys if (p := self._release.key_position(ctx, k)) is not None]
        else:
            # No positions recorded: count the request's stored blocks from its start (they
            # arrive in order), so its cached prefix is taken as 0 (see prefill_evidence).
            first = plan.stored_end or 0
            positions = [first + (i + 1) * self.tokens_per_key for i in range(len(keys))]
        if not positions:
            return
        end = max(positions)
        if plan.prefill_from is None:
            start = min(positions) - self.tokens_per_key
            plan.prefill_from = (max(start, 0), plan.last_lookup)
        cached, began = plan.prefill_from
        before = plan.stored_end or cached
        plan.stored_end = max(end, plan.stored_end or 0)
        new = plan.stored_end - cached
        if plan.stored_end > before:
            self._note_stored(now, plan, before, plan.stored_end - before)
        if began is None or len(keys) < MIN_EVIDENCE_KEYS or new <= 0:
            return
        own = plan.serial
        others = [(c, n) for t, who, c, n in self._stored if t > began and who != own]
        self.policy.observe_prefill([(cached, new), *others], now - began)

    def _note_stored(self, now: float, plan: _Plan, cached: int, tokens: int) -> None:
        """Keep what this store job added, for the windows of other requests' evidence."""
        self._stored.append((now, plan.serial, cached, tokens))
        while self._stored and self._stored[0][0] < now - STORED_WINDOW_S:
            self._stored.popleft()


@dataclass
class _PlanSlot:
    """The request-context slot holding each tier's plan (keyed by tier name)."""

    by_tier: dict[str, _Plan] = field(default_factory=dict)
