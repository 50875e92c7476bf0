"""Per-request restore-or-recompute in a tier, with a fake clock (no engine)."""

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext

from kvtier.policy import RestorePrior
from kvtier.runtime.engine_policy import (
    CUDA_HOST_COPY_PRIOR_BYTES_PER_S,
    HOST_COPY_PRIOR_BYTES_PER_S,
    make_policy,
)
from kvtier.runtime.step_clock import StepClock
from kvtier.vllm.tier_decider import MIN_PREFILL_EVIDENCE, REQUEST_DECISION_KEY, TierDecider
from tests.support.policy import engine_wait_s, predict_restore_s
from tests.support.releases import API025, API032

TOKENS, ROW = 128, 128 * 45 * 1024  # SmolLM2-135M: 45 KiB of KV per token


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def key(i: int) -> bytes:
    return i.to_bytes(4, "big") * 9


def request(n_keys: int, first: int = 0, params: dict | None = None) -> ReqContext:
    ctx = ReqContext(req_id=f"r{first}-{n_keys}", kv_transfer_params=params)
    for i in range(first, first + n_keys):
        ctx.set_offload_key_position(key(i), (i + 1) * TOKENS)
    return ctx


def decider(clock: Clock, enabled: bool = True, tier_prior: RestorePrior | None = None):
    policy = make_policy(enabled, clock)
    if tier_prior is None:
        policy.add_tier("disk", via="host")
    else:
        policy.add_tier("disk", tier_prior, via="host")
    return TierDecider(policy, "disk", TOKENS, ROW, clock, observes_prefill=True)


def measure_prefill(d: TierDecider, clock: Clock, seconds_per_token: float) -> None:
    """Feed prefill chunks the way vLLM's store jobs reveal them."""
    for r in range(int(MIN_PREFILL_EVIDENCE) + 2):
        ctx = request(16, first=1000 * (r + 1))
        d.on_lookup(ctx)
        clock.now += 16 * TOKENS * seconds_per_token
        d.on_store([key(1000 * (r + 1) + i) for i in range(16)], ctx)


#: A 1 MB/s tier with 0.5 s per load, and a fast tier whose 50 ms per load outweighs one block.
SLOW = RestorePrior(bandwidth_bytes_per_s=1e6, latency_s=0.5)
LAGGY = RestorePrior(bandwidth_bytes_per_s=2e9, latency_s=0.05)


def measured_decider(prior: RestorePrior) -> TierDecider:
    """A decider over a tier of ``prior`` whose engine prefill was measured at 0.1 ms a token
    (one block recomputes in ~13 ms)."""
    clock = Clock()
    d = decider(clock, tier_prior=prior)
    measure_prefill(d, clock, 1e-4)
    return d


def ask(d: TierDecider, ctx: ReqContext, n_keys: int) -> list[LookupResult]:
    return [d.hit(key(i), ctx) for i in range(n_keys)]


def test_before_prefill_is_measured_hits_are_restored_at_once():
    d = decider(Clock())
    assert ask(d, request(8), 8) == [LookupResult.HIT] * 8
    assert d.counts.unmeasured == 1


def test_decision_off_restores_every_hit():
    clock = Clock()
    d = decider(clock, enabled=False)
    measure_prefill(d, clock, 1e-6)
    assert ask(d, request(8), 8) == [LookupResult.HIT] * 8
    assert d.counts.off == 1


def test_a_tier_slower_than_recompute_is_refused_for_the_whole_request():
    clock = Clock()
    slow = RestorePrior(bandwidth_bytes_per_s=1e6, latency_s=0.5)  # 1 MB/s
    d = decider(clock, tier_prior=slow)
    measure_prefill(d, clock, 1e-4)  # fast prefill: 0.1 ms a token
    assert d.policy.prefill.evidence >= MIN_PREFILL_EVIDENCE
    ctx = request(8)
    assert ask(d, ctx, 8) == [LookupResult.RETRY] * 8, "collected, not yet decided"
    d.end_step()
    assert ask(d, ctx, 8) == [LookupResult.MISS] * 8
    assert d.counts.recompute == 1


def test_a_request_that_opts_out_is_restored_where_the_others_are_refused():
    d = measured_decider(SLOW)
    opted_out = request(8, params={REQUEST_DECISION_KEY: False})
    assert ask(d, opted_out, 8) == [LookupResult.HIT] * 8
    assert d.counts.off == 1
    for params in (None, {}, {REQUEST_DECISION_KEY: True}, {"other": 1}):
        ctx = request(8, params=params)
        assert ask(d, ctx, 8) == [LookupResult.RETRY] * 8, params
        d.end_step()
        assert ask(d, ctx, 8) == [LookupResult.MISS] * 8, params
    assert d.counts.recompute == 4


def test_a_bad_opt_out_value_is_ignored_with_one_warning(caplog):
    d = measured_decider(SLOW)
    for _ in range(2):
        ctx = request(8, params={REQUEST_DECISION_KEY: "no"})
        assert ask(d, ctx, 8) == [LookupResult.RETRY] * 8, "a string is not false"
        d.end_step()
        assert ask(d, ctx, 8) == [LookupResult.MISS] * 8
    warnings = [r for r in caplog.records if REQUEST_DECISION_KEY in r.getMessage()]
    assert len(warnings) == 1, warnings


def test_a_tier_faster_than_recompute_is_restored_without_losing_a_step():
    """When one block alone is worth restoring the whole hit is (restore cost per token is
    flat, recompute cost grows with position): HIT at the first lookup, no RETRY step."""
    clock = Clock()
    fast = RestorePrior(bandwidth_bytes_per_s=2e9, latency_s=0.001)
    d = decider(clock, tier_prior=fast)
    measure_prefill(d, clock, 4e-3)  # CPU-like prefill: 4 ms a token
    ctx = request(8)
    assert ask(d, ctx, 8) == [LookupResult.HIT] * 8
    assert d.counts.restore == 1
    d.end_step()
    assert ask(d, ctx, 8) == [LookupResult.HIT] * 8
    assert d.counts.restore == 1, "one verdict per request"


def test_a_hit_worth_restoring_only_as_a_whole_is_collected_then_restored():
    """A tier whose fixed latency outweighs one block's recompute, but not the whole hit's:
    the first block alone would be refused, so the hit is collected for a step and decided
    as a whole (restored)."""
    clock = Clock()
    laggy = RestorePrior(bandwidth_bytes_per_s=2e9, latency_s=0.05)  # 50 ms per load
    d = decider(clock, tier_prior=laggy)
    measure_prefill(d, clock, 1e-4)  # 0.1 ms a token: one block recomputes in ~13 ms
    one = d.policy.decide("disk", 0, TOKENS, ROW, count=False)
    assert not one.restore, one
    ctx = request(64)
    assert ask(d, ctx, 64) == [LookupResult.RETRY] * 64
    d.end_step()
    assert ask(d, ctx, 64) == [LookupResult.HIT] * 64
    assert d.counts.restore == 1
    assert d.policy.snapshot().tiers["disk"].refused == 0, "the look-ahead is not a verdict"


def test_store_jobs_of_single_blocks_are_not_prefill_evidence():
    clock = Clock()
    d = decider(clock)
    ctx = request(4)
    d.on_lookup(ctx)
    for i in range(4):  # decode-time: one block at a time
        clock.now += 1.0
        d.on_store([key(i)], ctx)
    assert d.policy.prefill.evidence == 0


def test_store_jobs_bunched_at_the_end_of_a_chunked_prefill_still_measure_it():
    """vLLM's store jobs reach a tier late (after the host pool cascades them): the jobs of
    both chunks of a two-chunk prefill can arrive together at its end. The measured prefill
    cost must still be that of the whole prompt, not 4,096 tokens in milliseconds."""
    clock = Clock()
    fast = RestorePrior(bandwidth_bytes_per_s=1e9, latency_s=0.001)
    d = decider(clock, tier_prior=fast)
    per_token = 1e-3  # 1 ms a token: 8k tokens in ~8 s
    for r in range(int(MIN_PREFILL_EVIDENCE) + 2):
        ctx = request(64, first=1000 * (r + 1))
        d.on_lookup(ctx)
        clock.now += 64 * TOKENS * per_token  # both chunks computed
        d.on_store([key(1000 * (r + 1) + i) for i in range(32)], ctx)
        clock.now += 0.01
        d.on_store([key(1000 * (r + 1) + i) for i in range(32, 64)], ctx)
        d.end_step()
    predicted = d.policy.prefill.recompute_seconds(0, 16 * TOKENS)
    assert predicted >= 0.25 * 16 * TOKENS * per_token, f"recompute of 2k tokens: {predicted}"
    ctx = request(16)
    ask(d, ctx, 16)
    d.end_step()
    assert ask(d, ctx, 16) == [LookupResult.HIT] * 16, "a 1 GB/s tier beats a 2 s prefill"


def test_the_look_ahead_refuses_a_slow_disk_at_the_first_key_without_losing_a_step():
    """vLLM records every key's position before the lookups: a tier that knows all it holds
    weighs its whole run at the first hit key, so a refusal costs no RETRY step either."""
    d = measured_decider(SLOW)
    ctx = request(8)
    held = {key(i) for i in range(8)}
    assert d.hit(key(0), ctx, holds=held.__contains__, knows_all=True) == LookupResult.MISS
    assert d.counts.recompute == 1
    assert ask(d, ctx, 8) == [LookupResult.MISS] * 8, "the verdict stands for every key"
    assert d.policy.snapshot().tiers["disk"].refused == 1


def test_the_look_ahead_restores_a_run_that_pays_only_as_a_whole_at_once():
    """The collected case above, decided at the first key: the run of 64 held blocks pays."""
    d = measured_decider(LAGGY)
    ctx = request(64)
    held = {key(i) for i in range(64)}
    assert d.hit(key(0), ctx, holds=held.__contains__, knows_all=True) == LookupResult.HIT
    assert d.counts.restore == 1


def test_the_look_ahead_weighs_only_the_blocks_the_tier_holds():
    """The run ends at the first block the tier lacks: 2 held blocks of 64 do not pay for a
    laggy tier, so the request is recomputed though all 64 are recorded."""
    d = measured_decider(LAGGY)
    ctx = request(64)
    held = {key(0), key(1)} | {key(i) for i in range(3, 64)}
    assert d.hit(key(0), ctx, holds=held.__contains__, knows_all=True) == LookupResult.MISS
    assert d.counts.recompute == 1


def test_a_tier_that_may_not_know_all_it_holds_collects_instead_of_refusing():
    """For a shared store a block it has not seen may still be on the server: a short run
    that does not pay is no reason to refuse, so the hit is collected and decided whole."""
    d = measured_decider(LAGGY)
    ctx = request(64)
    seen = {key(0), key(1)}
    assert d.hit(key(0), ctx, holds=seen.__contains__, knows_all=False) == LookupResult.RETRY
    assert [d.hit(key(i), ctx) for i in range(1, 64)] == [LookupResult.RETRY] * 63
    d.end_step()
    assert ask(d, ctx, 64) == [LookupResult.HIT] * 64
    assert d.counts.restore == 1
    assert d.policy.snapshot().tiers["disk"].refused == 0


def test_the_prefill_gauge_states_the_whole_prefill_cost_and_zero_until_measured():
    """Prefill that is all attention (a fit with per_token_s = 0) used to read 0 s/token."""
    clock = Clock()
    d = decider(clock)
    assert d.prefill_per_token_s() == 0.0
    measure_prefill(d, clock, 4e-3)
    assert d.prefill_per_token_s() == pytest.approx(
        d.policy.prefill.recompute_seconds(0, 2048) / 2048
    )
    assert d.prefill_per_token_s() > 1e-3


#: A disk about twice as slow as the measured prefill: 16 blocks (92 MB) in ~0.4 s against a
#: ~0.2 s prefill of their 2,048 tokens.
HALF_SPEED = RestorePrior(bandwidth_bytes_per_s=2.3e8, latency_s=0.001)


@pytest.mark.parametrize("has_positions", [True, False], ids=["positions", "no-positions"])
def test_eight_requests_at_once_are_split_between_a_slow_disk_and_the_engine(has_positions):
    """Alone, each would be recomputed (the disk loses). Collected in one step and decided
    together in the scheduler's order, the first ones are restored (their loads start at
    once) while the engine prefills the others. Also on vLLM 0.25.1, which records no key
    positions (the plan is counted from the request's start)."""
    clock = Clock()
    policy = make_policy(True, clock)
    policy.add_tier("disk", HALF_SPEED, via="host")
    d = TierDecider(
        policy,
        "disk",
        TOKENS,
        ROW,
        clock,
        observes_prefill=True,
        release=API032 if has_positions else API025,
    )
    measure_prefill(d, clock, 1e-4)
    contexts = [request(16, first=100 * (r + 1)) for r in range(8)]
    for r, ctx in enumerate(contexts):
        d.on_lookup(ctx)
        first = 100 * (r + 1)
        assert [d.hit(key(first + i), ctx) for i in range(16)] == [LookupResult.RETRY] * 16
    d.end_step()
    verdicts = [d.hit(key(100 * (r + 1)), ctx) for r, ctx in enumerate(contexts)]
    restored = verdicts.count(LookupResult.HIT)
    assert 0 < restored < 8
    assert verdicts == [LookupResult.HIT] * restored + [LookupResult.MISS] * (8 - restored)
    assert (d.counts.restore, d.counts.recompute) == (restored, 8 - restored)
    assert engine_wait_s(policy) > 0

    # The same request alone, once the queues have drained, is recomputed again.
    clock.now += 60.0
    alone = request(16, first=5000)
    assert [d.hit(key(5000 + i), alone) for i in range(16)] == [LookupResult.RETRY] * 16
    d.end_step()
    assert d.hit(key(5000), alone) == LookupResult.MISS


def test_prefills_that_share_the_engine_are_timed_with_the_work_done_beside_them():
    """Eight requests looked up together and prefilled one after another: each one's window
    (last lookup to its store job) spans the prefills before it. Counting the other requests'
    stored tokens in that window keeps the fit at the engine's real speed; timed alone, the
    later requests read up to eight times slower, and the decision restored from a disk
    slower than prefill (the 32B shape on the H200)."""
    per_token_s = 1e-4
    clock = Clock()
    d = decider(clock)
    contexts = [request(16, first=100 * (r + 1)) for r in range(8)]
    for ctx in contexts:
        d.on_lookup(ctx)
    for r, ctx in enumerate(contexts):
        clock.now += 16 * TOKENS * per_token_s  # the engine prefills this one alone
        d.on_store([key(100 * (r + 1) + i) for i in range(16)], ctx)
    predicted = d.policy.prefill.recompute_seconds(0, 16 * TOKENS)
    assert predicted == pytest.approx(16 * TOKENS * per_token_s, rel=0.25)


def test_the_host_copy_is_predicted_at_the_platforms_prior():
    """Nothing times the host pool's copy to the engine; on CUDA its prior is PCIe's, not the
    CPU backend's (there, a 2 GiB disk restore was predicted 0.45 s too slow)."""
    gib2 = 2 * 2**30
    cpu = make_policy(True, lambda: 0.0)
    cuda = make_policy(True, lambda: 0.0, CUDA_HOST_COPY_PRIOR_BYTES_PER_S)
    assert predict_restore_s(cpu, "host", gib2) == pytest.approx(
        gib2 / HOST_COPY_PRIOR_BYTES_PER_S, rel=0.01
    )
    assert predict_restore_s(cuda, "host", gib2) == pytest.approx(
        gib2 / CUDA_HOST_COPY_PRIOR_BYTES_PER_S, rel=0.01
    )
    assert predict_restore_s(cuda, "host", gib2) < predict_restore_s(cpu, "host", gib2) / 2


def chunked_prefills(timed_steps: bool, prompts: int = 3) -> TierDecider:
    """A decider fed 32k-token prompts, each in four 8k chunks of 0.5 s, as vLLM 0.25.1 runs
    them with two steps in flight and hands their store jobs on: the second chunk is scheduled
    at once, each later one once the chunk two before it is done; a chunk's job reaches the
    tier only when the chunk two after it ends (its copy off the GPU is reported with a later
    step's output), and the last two in the decode steps after the prompt. (H100, Llama-3-70B
    shape with 20 layers: the first chunk of a 32k prompt was computed 0.45 s after the
    lookup and its job arrived after 1.57 s.)"""
    clock = Clock()
    policy = make_policy(True, clock)
    policy.add_tier("disk", via="host")
    steps = StepClock(clock, depth=2) if timed_steps else None
    d = TierDecider(
        policy,
        "disk",
        TOKENS,
        ROW,
        clock,
        observes_prefill=True,
        release=API025,
        step_clock=steps,
    )
    chunks, per_chunk, chunk_s = 4, 64, 0.5
    for r in range(prompts):
        first = 10_000 * (r + 1)
        ctx = ReqContext(req_id=f"p{r}")
        jobs = [[key(first + c * per_chunk + i) for i in range(per_chunk)] for c in range(chunks)]

        def schedule(chunk: int | None, jobs: list[list[bytes]] = jobs) -> None:
            if steps is not None:
                steps.step_scheduled()
                if chunk is not None:
                    steps.will_store(jobs[chunk])

        d.on_lookup(ctx)
        schedule(0)
        clock.now += 0.001
        schedule(1)
        for c in range(chunks):
            clock.now += chunk_s  # chunk c computed
            schedule(c + 2 if c + 2 < chunks else None)
            if c >= 2:
                d.on_store(jobs[c - 2], ctx)
        for c in (chunks - 2, chunks - 1):  # decode steps of 10 ms
            clock.now += 0.01
            schedule(None)
            d.on_store(jobs[c], ctx)
        clock.now += 1.0
    return d


def test_a_chunked_prefill_is_timed_to_the_steps_that_computed_it_not_to_late_jobs():
    """With the scheduler's step times (kvtier's CUDA spec), each chunk's evidence ends when
    its step did; timed to the jobs' arrival, 8k tokens read as 1.5 s instead of 0.5 s and the
    fit, which takes the lateness for a cost per step, is a fifth off at 32k."""
    on_time = chunked_prefills(timed_steps=True)
    late = chunked_prefills(timed_steps=False)
    for tokens, seconds in ((8192, 0.5), (32768, 2.0)):
        timed = on_time.policy.prefill.recompute_seconds(0, tokens)
        assert abs(timed / seconds - 1) < 0.05, (tokens, timed)
    assert abs(late.policy.prefill.recompute_seconds(0, 32768) / 2.0 - 1) > 0.15


def test_the_engines_loads_are_held_to_the_deadline_rule_as_the_policy_defines_it():
    """One value per knob: the engine's policy takes every deadline bound from
    ``DeadlineRule``'s own defaults, not from a second value of its own."""
    from kvtier.policy import DeadlineRule

    for timed in (False, True):
        settings = make_policy(True, lambda: 0.0, prefill_timed_to_steps=timed).settings
        assert settings.deadline == DeadlineRule()
