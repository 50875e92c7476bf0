"""kvtier.policy.RestorePolicy: restore only what beats recompute; deadlines; slow tiers recover.

Fake clock and fake tiers throughout: a "tier" is only the numbers an adapter would report
(bytes moved, seconds taken), so every scenario is exact and instant.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.errors import ConfigError
from kvtier.policy import (
    BatchHit,
    DeadlineRule,
    PolicySettings,
    PrefillCoefficients,
    PrefillModel,
    RestorePolicy,
    RestorePrior,
    TierHit,
    attended_pairs,
)
from tests.support.policy import engine_wait_s, overdue, predict_restore_s

KIB = 1 << 10
GIB = 1 << 30
#: Llama-3-8B KV in bf16: 32 layers x 2 x 8 heads x 128 dims x 2 bytes.
TOKEN_BYTES = 128 * KIB
#: An engine that prefills at 50 us/token plus attention (an 8B model on a big GPU, roughly).
ENGINE = PrefillCoefficients(step_s=0.003, per_token_s=2.5e-5, per_pair_s=5e-10)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class FakeTier:
    """A tier that moves bytes at a fixed bandwidth after a fixed latency."""

    def __init__(self, bandwidth: float, latency_s: float = 0.001) -> None:
        self.bandwidth = bandwidth
        self.latency_s = latency_s

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth


def truth_recompute_s(cached: int, new: int) -> float:
    return ENGINE.per_token_s * new + ENGINE.per_pair_s * attended_pairs(cached, new)


def trained_engine() -> PrefillModel:
    """A prefill model that has seen a handful of the engine's prompt steps."""
    model = PrefillModel()
    for m, n in [(0, 512), (0, 2048), (0, 8192), (0, 32768), (8192, 8192), (30720, 2048)]:
        assert model.observe_step([(m, n)], ENGINE.step_seconds([(m, n)]))
    return model


def policy_with(
    tiers: dict[str, FakeTier], clock: FakeClock | None = None, **settings_kw: object
) -> RestorePolicy:
    policy = RestorePolicy(PolicySettings(**settings_kw), trained_engine(), clock or FakeClock())
    for name, tier in tiers.items():
        policy.add_tier(name)
        for nbytes in (2 << 20, 32 << 20, 256 << 20, GIB):
            policy.observe_load(name, nbytes, tier.seconds(nbytes))
    return policy


def run_load(policy: RestorePolicy, clock: FakeClock, tier: str, nbytes: int, seconds: float):
    ticket = policy.begin_load(tier, nbytes)
    clock.advance(seconds)
    return ticket, policy.end_load(ticket)


# -- the decision --------------------------------------------------------------------------


@given(
    cached=st.integers(0, 64_000),
    tokens=st.integers(16, 64_000),  # at least one 16-token block
)
@settings(max_examples=200, deadline=None)
def test_a_fast_tier_is_never_refused(cached, tokens):
    policy = policy_with({"host": FakeTier(bandwidth=50e9, latency_s=0.0001)})
    decision = policy.decide("host", cached, tokens, tokens * TOKEN_BYTES)
    # 50 GB/s moves a token's KV in 2.6 us after 0.1 ms; the engine needs >= 25 us a token,
    # so one block (16 tokens, 0.4 ms) already pays the latency with the safety factor.
    assert decision.restore
    assert decision.restore_tokens == tokens
    assert decision.reason == "restore is faster"


@given(cached=st.integers(0, 64_000), tokens=st.integers(1, 64_000))
@settings(max_examples=200, deadline=None)
def test_a_tier_slower_than_recompute_is_refused(cached, tokens):
    # 0.5 GB/s: 262 us per token of KV, more than recomputing any token under 500k context.
    policy = policy_with({"disk": FakeTier(bandwidth=0.5e9)})
    decision = policy.decide("disk", cached, tokens, tokens * TOKEN_BYTES)
    assert not decision.restore
    assert decision.restore_tokens == 0
    assert decision.plan_s == pytest.approx(decision.recompute_s)


def test_the_same_tier_is_refused_for_short_contexts_and_used_for_long_ones():
    # 2 GB/s (65 us per token) loses to recompute early in a prompt, wins late in it, where
    # each recomputed token attends to tens of thousands of others.
    policy = policy_with({"disk": FakeTier(bandwidth=2e9)})
    early = policy.decide("disk", 0, 2048, 2048 * TOKEN_BYTES)
    late = policy.decide("disk", 250_000, 2048, 2048 * TOKEN_BYTES)
    assert not early.restore
    assert late.restore
    assert truth_recompute_s(250_000, 2048) > FakeTier(2e9).seconds(2048 * TOKEN_BYTES)


BLOCK = 16
#: A tier, the engine's longest prompt and one hit in it (``blocks`` of ``BLOCK`` tokens after
#: ``cached``), for the promises made about every hit of a tier.
ANY_HIT = {
    "bandwidth": st.sampled_from([0.3e9, 0.5e9, 1e9, 2e9, 4e9, 8e9]),
    "latency": st.sampled_from([0.0, 0.001, 0.05]),
    "max_tokens": st.sampled_from([4096, 32768, 131_072]),
    "cached": st.integers(0, 131_072),
    "blocks": st.integers(1, 8192),
}


@given(**ANY_HIT)
@settings(max_examples=300, deadline=None)
def test_a_refusal_of_every_hit_holds_for_any_hit_within_the_longest_prompt(
    bandwidth, latency, max_tokens, cached, blocks
):
    """What refuse_every_hit promises: no hit of the tier in such a prompt is restored."""
    policy = policy_with({"disk": FakeTier(bandwidth, latency)})
    refusal = policy.refuse_every_hit("disk", max_tokens, BLOCK, BLOCK * TOKEN_BYTES)
    tokens = min(blocks * BLOCK, max_tokens)
    cached = min(cached, max_tokens - tokens)
    if refusal is not None:
        assert not refusal.restore
        assert not policy.decide("disk", cached, tokens, tokens * TOKEN_BYTES).restore


def test_every_hit_is_refused_only_when_even_the_last_token_is_cheaper_to_recompute():
    slow = policy_with({"disk": FakeTier(bandwidth=0.5e9)})
    refusal = slow.refuse_every_hit("disk", 32768, BLOCK, BLOCK * TOKEN_BYTES)
    assert refusal is not None and refusal.reason == "recompute is faster at any length"
    assert refusal.charges == (("engine", refusal.recompute_s),), "one block on the engine"
    assert slow.snapshot().tiers["disk"].refused == 1
    # 2 GB/s loses early in a prompt and wins late in a 250k one (the test above): a prompt
    # that long may hold a hit worth restoring, so nothing is refused in advance.
    medium = policy_with({"disk": FakeTier(bandwidth=2e9)})
    assert medium.refuse_every_hit("disk", 4096, BLOCK, BLOCK * TOKEN_BYTES) is not None
    assert medium.refuse_every_hit("disk", 262_144, BLOCK, BLOCK * TOKEN_BYTES) is None
    assert medium.decide("disk", 250_000, 2048, 2048 * TOKEN_BYTES).restore


def test_every_hit_is_refused_in_advance_only_with_nothing_queued_on_the_engine():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(bandwidth=0.5e9)}, clock)
    queued = policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES)
    policy.commit(queued)  # a recompute now queued on the engine
    assert engine_wait_s(policy) > 0
    assert policy.refuse_every_hit("disk", 32768, BLOCK, BLOCK * TOKEN_BYTES) is None
    clock.advance(queued.recompute_s + 1)
    assert policy.refuse_every_hit("disk", 32768, BLOCK, BLOCK * TOKEN_BYTES) is not None


def test_with_the_decision_off_nothing_is_refused_in_advance():
    policy = policy_with({"disk": FakeTier(bandwidth=0.5e9)}, enabled=False)
    assert policy.refuse_every_hit("disk", 32768, BLOCK, BLOCK * TOKEN_BYTES) is None


def test_the_decision_matches_the_truth_once_measured():
    tier = FakeTier(bandwidth=3e9, latency_s=0.002)
    policy = policy_with({"disk": tier}, safety_factor=1.0)
    for cached, tokens in [(0, 1024), (0, 16384), (32768, 2048), (100_000, 8192), (0, 200_000)]:
        nbytes = tokens * TOKEN_BYTES
        truth = tier.seconds(nbytes) < truth_recompute_s(cached, tokens)
        margin = abs(tier.seconds(nbytes) / truth_recompute_s(cached, tokens) - 1)
        if margin > 0.05:  # too close to call is left to the safety factor
            assert policy.decide("disk", cached, tokens, nbytes).restore is truth


def test_the_safety_factor_refuses_a_restore_that_wins_only_narrowly():
    tier = FakeTier(bandwidth=3e9, latency_s=0.0)
    cached, tokens = 0, 100_000
    # Find where restore wins by 10%: then a factor of 1.2 refuses and 1.0 restores.
    nbytes = int(truth_recompute_s(cached, tokens) / 1.1 * tier.bandwidth)
    strict = policy_with({"disk": tier}, safety_factor=1.2)
    loose = policy_with({"disk": tier}, safety_factor=1.0)
    assert not strict.decide("disk", cached, tokens, nbytes).restore
    assert loose.decide("disk", cached, tokens, nbytes).restore


def test_within_the_evidence_a_restore_that_wins_by_a_tenth_is_taken():
    """The hit is no larger than the tier's measured loads (1 GiB) and the prompt no longer
    than the engine's measured steps (32k): predictions interpolate, so the margin is
    ``safety_factor_within_evidence`` (1.05), not ``safety_factor`` (1.2)."""
    cached, tokens = 0, 8192  # 1 GiB of KV
    nbytes = tokens * TOKEN_BYTES
    tier = FakeTier(bandwidth=nbytes / (truth_recompute_s(cached, tokens) / 1.1), latency_s=0)
    policy = policy_with({"disk": tier})
    decision = policy.decide("disk", cached, tokens, nbytes)
    assert decision.restore and decision.margin == 1.05
    # A 10 % win on a hit twice the largest load measured: the bandwidth is extrapolated.
    wins = 2 * nbytes / (truth_recompute_s(0, 2 * tokens) / 1.1)
    beyond = policy_with({"disk": FakeTier(wins, latency_s=0)}).decide(
        "disk", 0, 2 * tokens, 2 * nbytes
    )
    assert not beyond.restore and beyond.margin == 1.2


def test_a_prompt_longer_than_any_measured_step_is_held_to_the_full_factor():
    tier = FakeTier(bandwidth=3e9, latency_s=0.0)
    policy = policy_with({"disk": tier})
    assert policy.prefill.reach_tokens == 32768
    assert policy.decide("disk", 32768 - 1024, 1024, 1024 * TOKEN_BYTES).margin == 1.05
    assert policy.decide("disk", 32768, 1024, 1024 * TOKEN_BYTES).margin == 1.2


def test_a_measured_via_tier_bounds_the_evidence_and_an_unmeasured_one_does_not():
    """A disk hit also pays the host pool's copy. Measured only on smaller loads, that copy's
    prediction extrapolates; never measured (vLLM's own pool on CUDA), it is its prior, which
    errs slow and can only cost a missed gain."""
    measured = policy_with({"host": FakeTier(20e9)})  # loads up to 1 GiB
    unmeasured = policy_with({})
    unmeasured.add_tier("host", RestorePrior(12e9, 0.0005))
    for policy in (measured, unmeasured):
        policy.add_tier("disk", via="host")
        policy.observe_load("disk", 4 * GIB, 2.0)
    hit = (0, 16384, 2 * GIB)
    assert measured.decide("disk", *hit).margin == 1.2
    assert unmeasured.decide("disk", *hit).margin == 1.05
    assert measured.decide("disk", 0, 8192, GIB).margin == 1.05


def test_the_smaller_factor_is_used_within_the_evidence():
    policy = policy_with({"disk": FakeTier(3e9)}, safety_factor=1.0)
    assert policy.decide("disk", 0, 8192, GIB).margin == 1.0
    wide = policy_with({"disk": FakeTier(3e9)}, safety_factor_within_evidence=1.1)
    assert wide.decide("disk", 0, 8192, GIB).margin == 1.1


def test_a_tier_that_is_writing_is_held_to_the_full_factor():
    """Its loads share the device with write-back, which the loads it measured did not: on
    the GPU hosts such restores took 1.14-1.49x the same reads alone. The same 10 % win that
    is taken with the tier quiet is refused while it writes."""
    cached, tokens = 0, 8192
    nbytes = tokens * TOKEN_BYTES
    tier = FakeTier(bandwidth=nbytes / (truth_recompute_s(cached, tokens) / 1.1), latency_s=0)
    writes: list[int] = []
    policy = RestorePolicy(PolicySettings(), trained_engine(), FakeClock())
    policy.add_tier("disk", writing=lambda: bool(writes))
    for size in (2 << 20, 32 << 20, 256 << 20, GIB):
        policy.observe_load("disk", size, tier.seconds(size))
    pair = [BatchHit(cached, tokens, nbytes)] * 2
    quiet = policy.decide("disk", cached, tokens, nbytes, count=False, queued=False)
    assert quiet.restore and quiet.margin == 1.05
    assert [d.margin for d in policy.decide_batch("disk", pair)] == [1.05, 1.05]
    writes.append(1)
    busy = policy.decide("disk", cached, tokens, nbytes, count=False, queued=False)
    assert not busy.restore and busy.margin == 1.2
    assert [d.margin for d in policy.decide_batch("disk", pair)] == [1.2, 1.2]


def test_an_unmeasured_tier_is_beyond_the_evidence():
    policy = RestorePolicy(PolicySettings(), trained_engine(), FakeClock())
    policy.add_tier("disk")
    assert policy.decide("disk", 0, 16, 16 * TOKEN_BYTES).margin == 1.2


#: An engine whose prefill is mostly attention (a deep model with few KV heads, say).
ATTENTION_HEAVY = PrefillCoefficients(step_s=0.003, per_token_s=1e-6, per_pair_s=5e-9)


def one_shape_policy(engine: PrefillCoefficients) -> tuple[RestorePolicy, float]:
    """A policy whose engine has prefilled only 8k prompts from token 0 (its steps cannot
    tell per-token from attention cost), and what it predicts one such prompt to cost."""
    model = PrefillModel()
    for _ in range(8):
        model.observe_step([(0, 8192)], engine.step_seconds([(0, 8192)]))
    return RestorePolicy(PolicySettings(), model, FakeClock()), model.recompute_seconds(0, 8192)


def measured_tier(policy: RestorePolicy, name: str, seconds_per_byte: float) -> None:
    policy.add_tier(name)
    for nbytes in (2 << 20, 32 << 20, 256 << 20, 4 * GIB):
        policy.observe_load(name, nbytes, nbytes * seconds_per_byte)


@pytest.mark.parametrize(
    ("engine", "tokens", "restore_in_8k_prompts", "restored"),
    [
        (ATTENTION_HEAVY, 2048, 1 / 8, False),  # a 2k prompt: 1/16 of an 8k one, or 1/4
        (ENGINE, 32768, 6.0, False),  # a 32k prompt: 4 times an 8k one, or 16 times
        (ENGINE, 32768, 2.0, True),
    ],
    ids=["2k-refused", "32k-refused", "32k-restored"],
)
def test_after_steps_of_one_shape_a_restore_must_beat_the_cheaper_split(
    engine, tokens, restore_in_8k_prompts, restored
):
    """Steps of 8k prompts alone cannot say how much of their cost is attention, so they
    cannot say whether another length costs more or less than in proportion. A restore is
    taken only if it beats the cheaper of the two: never one slower than recompute."""
    policy, eight_k = one_shape_policy(engine)
    nbytes = tokens * TOKEN_BYTES
    measured_tier(policy, "disk", restore_in_8k_prompts * eight_k / nbytes)
    decision = policy.decide("disk", 0, tokens, nbytes)
    cheaper = min(tokens / 8192, (tokens / 8192) ** 2) * eight_k
    assert decision.recompute_s == pytest.approx(cheaper, rel=0.01)
    assert decision.restore is restored
    truth = engine.per_token_s * tokens + engine.per_pair_s * attended_pairs(0, tokens)
    assert decision.recompute_s <= truth


def test_a_hit_in_a_chain_is_weighed_by_what_restoring_it_saves():
    """An 8k prompt whose first half a fast tier holds and its second a slow one, after steps
    of 8k prompts alone: restoring the first half saves a quarter of the prompt if all of
    its cost is attention, half if none is. It is weighed at the quarter, so a restore that
    takes a third of the prompt is refused (at the half it would have been taken)."""
    policy, eight_k = one_shape_policy(ENGINE)
    nbytes = 4096 * TOKEN_BYTES
    measured_tier(policy, "disk", eight_k / 3 / nbytes)
    measured_tier(policy, "slow", 100 * eight_k / nbytes)
    chain = [TierHit("disk", 4096, nbytes), TierHit("slow", 4096, nbytes)]
    assert policy.prefill.recompute_seconds(0, 4096) == pytest.approx(eight_k / 4)
    assert policy.prefill.recompute_seconds(4096, 4096) == pytest.approx(eight_k / 2)
    assert not policy.decide_chain(0, chain, queued=False).restore


def test_the_prior_is_conservative():
    # Never measured: a tier that is in truth fast enough (20 GB/s vs an engine at 25 us per
    # token) is still refused, and the prefill prior predicts recompute faster than it is.
    policy = RestorePolicy(PolicySettings(), PrefillModel(), FakeClock())
    policy.add_tier("disk")
    tokens = 8192
    assert not policy.decide("disk", 0, tokens, tokens * TOKEN_BYTES).restore
    assert policy.prefill.recompute_seconds(0, tokens) < truth_recompute_s(0, tokens)
    assert predict_restore_s(policy, "disk", tokens * TOKEN_BYTES) > FakeTier(20e9).seconds(
        tokens * TOKEN_BYTES
    )


def test_the_first_measurements_replace_the_priors():
    policy = RestorePolicy(PolicySettings(), PrefillModel(), FakeClock())
    policy.add_tier("disk")
    tier = FakeTier(bandwidth=20e9)
    tokens = 8192
    policy.observe_prefill([(0, tokens)], ENGINE.step_seconds([(0, tokens)]))
    policy.observe_load("disk", tokens * TOKEN_BYTES, tier.seconds(tokens * TOKEN_BYTES))
    assert policy.decide("disk", 0, tokens, tokens * TOKEN_BYTES).restore


def test_the_decision_off_always_restores():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(bandwidth=0.1e9)}, clock, enabled=False)
    policy.add_tier("never-measured")
    ticket = policy.begin_load("disk", GIB)
    clock.advance(ticket.deadline_s + 1)
    policy.abandon_load(ticket)  # slow mark too
    for tier in ("disk", "never-measured"):
        decision = policy.decide(tier, 0, 4096, 4096 * TOKEN_BYTES)
        assert decision.restore
        assert decision.restore_tokens == 4096
        assert decision.reason == "decision off"


def test_the_decision_off_still_enforces_deadlines():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(bandwidth=1e9)}, clock, enabled=False)
    ticket = policy.begin_load("disk", GIB)
    clock.advance(ticket.deadline_s * 1.01)
    assert overdue(policy, ticket)


def test_an_empty_hit_restores_nothing():
    policy = policy_with({"host": FakeTier(bandwidth=50e9)})
    decision = policy.decide("host", 100, 0, 0)
    assert not decision.restore
    assert decision.reason == "no hit"


def test_an_unknown_tier_is_an_error_naming_the_known_ones():
    policy = policy_with({"host": FakeTier(bandwidth=50e9)})
    with pytest.raises(ConfigError, match=r"unknown tier 'disk'; known: \['host'\]"):
        policy.decide("disk", 0, 16, 16 * TOKEN_BYTES)


def test_a_tier_added_twice_is_refused():
    policy = RestorePolicy(clock=FakeClock())
    policy.add_tier("disk")
    with pytest.raises(ConfigError, match="added twice"):
        policy.add_tier("disk")


# -- chains of tiers -----------------------------------------------------------------------


def test_a_chain_stops_at_the_first_tier_not_worth_restoring():
    policy = policy_with({"host": FakeTier(50e9), "shared": FakeTier(0.2e9)})
    hits = [TierHit("host", 4096, 4096 * TOKEN_BYTES), TierHit("shared", 4096, 4096 * TOKEN_BYTES)]
    decision = policy.decide_chain(0, hits)
    assert decision.restore_tiers == ("host",)
    assert decision.restore_tokens == 4096


def test_a_chain_restores_a_marginal_tier_that_a_fast_next_tier_makes_worth_it():
    # The first tier alone is a little slower than recompute (refused on its own); the next
    # covers many expensive late tokens cheaply, and only a restore of both can use it.
    first = FakeTier(bandwidth=1.5e9, latency_s=0.0)
    policy = policy_with({"disk": first, "host": FakeTier(50e9)}, safety_factor=1.0)
    alone = policy.decide("disk", 0, 2048, 2048 * TOKEN_BYTES)
    both = policy.decide_chain(
        0,
        [TierHit("disk", 2048, 2048 * TOKEN_BYTES), TierHit("host", 60_000, 60_000 * TOKEN_BYTES)],
    )
    assert not alone.restore
    assert both.restore_tiers == ("disk", "host")


def test_a_tier_via_another_pays_both_copies():
    policy = policy_with({"host": FakeTier(5e9, latency_s=0.0)})
    policy.add_tier("disk", via="host")
    policy.observe_load("disk", GIB, 0.5)
    assert predict_restore_s(policy, "disk", GIB) == pytest.approx(0.5 + GIB / 5e9, rel=0.02)
    assert policy.begin_load("disk", GIB).predicted_s == pytest.approx(0.5, rel=0.02)


def test_a_tier_via_an_unknown_tier_is_refused():
    policy = RestorePolicy(clock=FakeClock())
    with pytest.raises(ConfigError, match="via='host', which is not a tier yet; add it first"):
        policy.add_tier("disk", via="host")


def test_a_refused_tier_is_counted():
    policy = policy_with({"disk": FakeTier(bandwidth=0.2e9)})
    for _ in range(3):
        policy.decide("disk", 0, 1024, 1024 * TOKEN_BYTES)
    assert policy.snapshot().tiers["disk"].refused == 3


# -- deadlines -----------------------------------------------------------------------------


def test_a_load_gets_multiplier_times_its_predicted_time():
    clock = FakeClock()
    tier = FakeTier(bandwidth=2e9, latency_s=0.0)
    policy = policy_with({"disk": tier}, clock, deadline=DeadlineRule(multiplier=3.0))
    ticket = policy.begin_load("disk", GIB)
    assert ticket.deadline_s == pytest.approx(3.0 * tier.seconds(GIB), rel=0.02)
    assert ticket.deadline_at_s == pytest.approx(clock.now + ticket.deadline_s)


@pytest.mark.parametrize(
    ("predicted", "expected"),
    [(0.0001, 0.05), (0.1, 0.4), (20.0, 30.0)],
    ids=["floor", "multiplier", "ceiling"],
)
def test_the_deadline_rule_clamps_between_floor_and_ceiling(predicted, expected):
    rule = DeadlineRule(ceiling_s=30.0, multiplier=4.0, floor_s=0.05)
    assert rule.deadline_s(predicted) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"ceiling_s": 0.0}, "ceiling_s=0.0"),
        ({"multiplier": 0.5}, "multiplier=0.5: .*give a number >= 1"),
        ({"floor_s": 40.0}, r"floor_s=40.0; give 0 <= floor_s <= ceiling_s \(30.0\)"),
        ({"ceiling_s": math.inf}, "ceiling_s=inf"),
    ],
)
def test_a_bad_deadline_rule_is_refused_with_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DeadlineRule(**kwargs)


def test_a_load_is_overdue_only_after_its_deadline():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(2e9)}, clock)
    ticket = policy.begin_load("disk", GIB)
    clock.advance(ticket.deadline_s * 0.99)
    assert not overdue(policy, ticket)
    clock.advance(ticket.deadline_s * 0.02)
    assert overdue(policy, ticket)


def test_a_completed_or_abandoned_load_is_never_overdue():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(2e9)}, clock)
    done, _ = run_load(policy, clock, "disk", GIB, 0.1)
    gone = policy.begin_load("disk", GIB)
    clock.advance(gone.deadline_s + 1)
    policy.abandon_load(gone)
    clock.advance(1000)
    assert not overdue(policy, done)
    assert not overdue(policy, gone)


# -- overruns, the slow mark and recovery --------------------------------------------------


def overrun(policy: RestorePolicy, clock: FakeClock, tier: str, nbytes: int) -> None:
    ticket = policy.begin_load(tier, nbytes)
    clock.advance(ticket.deadline_s * 1.01)
    assert overdue(policy, ticket)
    policy.abandon_load(ticket)


def test_an_overrun_marks_the_tier_slow_and_inflates_its_estimate():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(10e9)}, clock)
    before = predict_restore_s(policy, "disk", GIB)
    assert policy.decide("disk", 0, 65536, 65536 * TOKEN_BYTES).restore
    overrun(policy, clock, "disk", GIB)
    tier = policy.snapshot().tiers["disk"]
    assert tier.slow
    assert tier.overruns == 1
    assert tier.inflation == PolicySettings().slow_inflation
    assert predict_restore_s(policy, "disk", GIB) > 4 * before
    assert not policy.decide("disk", 0, 65536, 65536 * TOKEN_BYTES).restore


def test_repeated_overruns_double_the_inflation_up_to_its_cap():
    clock = FakeClock()
    policy = policy_with(
        {"disk": FakeTier(10e9)}, clock, slow_inflation=4.0, slow_inflation_max=10.0
    )
    factors = []
    for _ in range(3):
        overrun(policy, clock, "disk", GIB)
        factors.append(policy.snapshot().tiers["disk"].inflation)
    assert factors == [4.0, 8.0, 10.0]


def test_a_slow_tier_recovers_after_enough_on_time_loads():
    clock = FakeClock()
    tier = FakeTier(10e9)
    policy = policy_with({"disk": tier}, clock, recovery_loads=3)
    overrun(policy, clock, "disk", GIB)
    for i in range(3):
        assert policy.snapshot().tiers["disk"].slow, f"recovered after only {i} loads"
        _, on_time = run_load(policy, clock, "disk", GIB, tier.seconds(GIB))
        assert on_time
    assert not policy.snapshot().tiers["disk"].slow
    assert policy.snapshot().tiers["disk"].inflation == 1.0
    assert policy.decide("disk", 0, 65536, 65536 * TOKEN_BYTES).restore


def test_a_late_load_restarts_the_recovery_count():
    clock = FakeClock()
    tier = FakeTier(10e9)
    policy = policy_with({"disk": tier}, clock, recovery_loads=2)
    overrun(policy, clock, "disk", GIB)
    run_load(policy, clock, "disk", GIB, tier.seconds(GIB))
    ticket = policy.begin_load("disk", GIB)
    clock.advance(ticket.deadline_s * 2)
    assert policy.end_load(ticket) is False  # completed late, never abandoned: an overrun
    run_load(policy, clock, "disk", GIB, tier.seconds(GIB))
    assert policy.snapshot().tiers["disk"].slow
    run_load(policy, clock, "disk", GIB, tier.seconds(GIB))
    assert not policy.snapshot().tiers["disk"].slow


def test_an_abandoned_loads_late_completion_refines_the_estimate_but_does_not_recover():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(10e9)}, clock)
    ticket = policy.begin_load("disk", GIB)
    clock.advance(ticket.deadline_s * 1.01)
    policy.abandon_load(ticket)
    policy.abandon_load(ticket)  # idempotent
    estimate_after_abandon = predict_restore_s(policy, "disk", GIB)
    clock.advance(5.0)  # the I/O finally returns, much later
    assert policy.end_load(ticket) is False
    tier = policy.snapshot().tiers["disk"]
    assert tier.slow
    assert tier.overruns == 1
    assert predict_restore_s(policy, "disk", GIB) > estimate_after_abandon


def test_a_slow_tier_recovers_through_background_probes():
    clock = FakeClock()
    tier = FakeTier(10e9)
    policy = policy_with({"disk": tier}, clock, probe_interval_s=10.0, recovery_loads=3)
    overrun(policy, clock, "disk", GIB)
    probes = 0
    for _ in range(100):
        clock.advance(1.0)
        if policy.probe_due("disk"):
            probes += 1
            policy.observe_load("disk", 32 << 20, tier.seconds(32 << 20))
        if not policy.snapshot().tiers["disk"].slow:
            break
    assert probes == 3
    assert not policy.snapshot().tiers["disk"].slow


def test_probes_are_due_for_never_measured_and_slow_tiers_only_once_per_interval():
    clock = FakeClock()
    policy = RestorePolicy(PolicySettings(probe_interval_s=10.0), clock=clock)
    policy.add_tier("disk")
    assert policy.probe_due("disk")  # never measured
    assert not policy.probe_due("disk")  # claimed: not again within the interval
    clock.advance(10.0)
    assert policy.probe_due("disk")
    policy.observe_load("disk", GIB, 0.3)
    clock.advance(100.0)
    assert not policy.probe_due("disk")  # measured and healthy: no probes


# -- settings ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"safety_factor": 0.9}, "safety_factor=0.9: .*give a number >= 1"),
        (
            {"safety_factor_within_evidence": 0.9},
            "safety_factor_within_evidence=0.9: .*give a number >= 1",
        ),
        ({"slow_inflation": 1.0}, "slow_inflation=1.0: .*give a number > 1"),
        ({"slow_inflation_max": 2.0}, "slow_inflation_max=2.0; give a number >= slow_inflation"),
        ({"recovery_loads": 0}, "recovery_loads=0: .*give an integer >= 1"),
        ({"enabled": "yes"}, "enabled='yes': .*give true or false"),
        ({"probe_interval_s": -1.0}, "probe_interval_s=-1.0"),
    ],
)
def test_bad_settings_are_refused_with_the_fix(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PolicySettings(**kwargs)


def test_a_prior_with_no_bandwidth_is_refused():
    with pytest.raises(ConfigError, match="bandwidth_bytes_per_s=0"):
        RestorePrior(bandwidth_bytes_per_s=0, latency_s=0.001)


def test_a_tier_measured_on_small_loads_is_not_predicted_faster_on_large_ones():
    """Loads of one size cannot tell latency from bandwidth; the prior's 1 GiB point then set
    the slope, and a 7.8 MB/s disk measured on 4 MB loads was predicted to move 16 MB in
    1.0 s (2.1 s in fact): an 8k restore was chosen over a 3x cheaper recompute."""
    settings = PolicySettings()  # as the engine runs it
    policy = RestorePolicy(settings, trained_engine(), FakeClock())
    policy.add_tier("disk")
    small, rate = 4 << 20, 7.8e6
    policy.observe_load("disk", small, small / rate)  # then refused: no other measurement
    assert not policy.snapshot().tiers["disk"].slow
    large = 16 << 20
    assert predict_restore_s(policy, "disk", large) >= 0.95 * large / rate
    assert predict_restore_s(policy, "disk", small) >= 0.95 * small / rate


def test_the_reported_bandwidth_is_the_one_predictions_use_not_the_fits():
    """The ``kvtier:tier_estimated_bandwidth`` gauge showed 28 MB/s for a 7.7 MB/s disk (the
    fit's slope, taken from the prior) while the decision used the throughput floor."""
    policy = RestorePolicy(clock=FakeClock())
    policy.add_tier("disk")
    small, rate = 4 << 20, 7.8e6
    for _ in range(3):
        policy.observe_load("disk", small, small / rate)
    tier = policy.snapshot().tiers["disk"]
    assert tier.bandwidth_bytes_per_s == pytest.approx(rate, rel=0.01)
    assert tier.fitted_bandwidth_bytes_per_s > 2 * rate, "the fit alone overrates this disk"


def test_a_tier_never_measured_gets_the_ceiling_and_then_the_rule():
    """The one place a load's deadline is set: the policy's ticket. A tier whose prior knows
    nothing of its disk or server may take the rule's ceiling; once a load was measured, the
    rule on its estimate."""
    clock = FakeClock()
    policy = RestorePolicy(PolicySettings(), trained_engine(), clock)
    policy.add_tier("disk")
    first = policy.begin_load("disk", GIB)
    assert first.deadline_s == policy.settings.deadline.ceiling_s
    clock.advance(0.5)
    policy.end_load(first)
    second = policy.begin_load("disk", GIB)
    assert second.deadline_s == policy.settings.deadline.deadline_s(second.predicted_s)
    assert second.deadline_s < policy.settings.deadline.ceiling_s


# -- whether a tier's writes can ever pay ---------------------------------------------------


@given(**ANY_HIT, within=st.booleans())
@settings(max_examples=300, deadline=None)
def test_a_tier_whose_restores_never_pay_gets_no_restore_verdict_at_any_hit(
    bandwidth, latency, max_tokens, cached, blocks, within
):
    """What restore_never_pays promises the write admission: with the engine idle, no hit of
    the tier in such a prompt is restored, whichever factor the verdict applies."""
    margin = {"safety_factor_within_evidence": 1.0} if within else {}
    policy = policy_with({"disk": FakeTier(bandwidth, latency)}, **margin)
    never = policy.restore_never_pays("disk", max_tokens, BLOCK, BLOCK * TOKEN_BYTES)
    tokens = min(blocks * BLOCK, max_tokens)
    cached = min(cached, max_tokens - tokens)
    if never:
        assert not policy.decide("disk", cached, tokens, tokens * TOKEN_BYTES).restore


def test_restores_never_pay_only_for_a_measured_tier_slower_than_every_prefill():
    slow = policy_with({"disk": FakeTier(bandwidth=0.5e9)})
    assert slow.restore_never_pays("disk", 32768, BLOCK, BLOCK * TOKEN_BYTES)
    assert slow.snapshot().tiers["disk"].refused == 0, "a question, not a verdict"
    # 2 GB/s wins late in a 250k-token prompt: an engine that takes such prompts keeps it.
    medium = policy_with({"disk": FakeTier(bandwidth=2e9)})
    assert medium.restore_never_pays("disk", 4096, BLOCK, BLOCK * TOKEN_BYTES)
    assert not medium.restore_never_pays("disk", 262_144, BLOCK, BLOCK * TOKEN_BYTES)
    # Nothing measured of the tier (its prior errs slow) or of the engine: never said.
    unmeasured = RestorePolicy(PolicySettings(), trained_engine(), FakeClock())
    unmeasured.add_tier("disk")
    assert not unmeasured.restore_never_pays("disk", 32768, BLOCK, BLOCK * TOKEN_BYTES)
    no_prefill = RestorePolicy(PolicySettings(), PrefillModel(), FakeClock())
    no_prefill.add_tier("disk")
    no_prefill.observe_load("disk", GIB, 10.0)
    assert not no_prefill.restore_never_pays("disk", 32768, BLOCK, BLOCK * TOKEN_BYTES)
    off = policy_with({"disk": FakeTier(bandwidth=0.5e9)}, enabled=False)
    assert not off.restore_never_pays("disk", 32768, BLOCK, BLOCK * TOKEN_BYTES)


def test_restores_never_paying_holds_whatever_is_queued_and_ignores_a_passing_slow_mark():
    clock = FakeClock()
    policy = policy_with({"disk": FakeTier(bandwidth=3e9)}, clock)
    assert not policy.restore_never_pays("disk", 131_072, BLOCK, BLOCK * TOKEN_BYTES)
    queued = policy.decide("disk", 0, 8192, 8192 * TOKEN_BYTES)
    policy.commit(queued)
    assert not policy.restore_never_pays("disk", 131_072, BLOCK, BLOCK * TOKEN_BYTES)
    # A slow mark (set as an overrun sets it, without the overrun's time in the fit) inflates
    # the tier's predictions until it recovers; what the tier measured is unchanged.
    policy.chain.estimate("disk").inflation = policy.settings.slow_inflation_max
    assert policy.snapshot().tiers["disk"].slow
    assert not policy.decide("disk", 0, 131_072 - 16, (131_072 - 16) * TOKEN_BYTES).restore
    assert not policy.restore_never_pays("disk", 131_072, BLOCK, BLOCK * TOKEN_BYTES)
