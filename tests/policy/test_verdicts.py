"""kvtier.policy.verdicts: the verdicts are pure; the facade holds the state and the counts."""

from kvtier.policy import BatchHit, PolicySettings, TierHit, verdicts
from kvtier.policy.backlog import ENGINE
from kvtier.policy.tier_chain import TierChain
from tests.policy.test_restore_policy import GIB, TOKEN_BYTES, FakeTier, trained_engine

SLOW_DISK = FakeTier(bandwidth=0.2e9, latency_s=0.01)
FAST_HOST = FakeTier(bandwidth=50e9, latency_s=0.0001)


def measured_chain(settings: PolicySettings, **tiers: FakeTier) -> TierChain:
    chain = TierChain(settings)
    for name, tier in tiers.items():
        chain.add(name)
        for nbytes in (2 << 20, 32 << 20, 256 << 20, GIB):
            chain.estimate(name).observe(nbytes, tier.seconds(nbytes), on_time=True)
    return chain


def refusals(chain: TierChain) -> dict[str, int]:
    return {name: est.refused for name, est in chain.estimates()}


def test_a_chain_verdict_changes_nothing_and_names_the_tiers_it_refused() -> None:
    settings = PolicySettings()
    chain, prefill = measured_chain(settings, host=FAST_HOST, disk=SLOW_DISK), trained_engine()
    hits = [TierHit("host", 2048, 2048 * TOKEN_BYTES), TierHit("disk", 8192, 8192 * TOKEN_BYTES)]
    before = (prefill.recent_steps(), refusals(chain))
    first = verdicts.decide_chain(chain, prefill, settings, 0, hits, verdicts.idle)
    again = verdicts.decide_chain(chain, prefill, settings, 0, hits, verdicts.idle)
    assert first == again
    decision, refused = first
    assert decision.restore_tiers == ("host",) and refused == ("disk",)
    assert (prefill.recent_steps(), refusals(chain)) == before


def test_a_queue_on_the_engine_is_read_through_the_waits_given() -> None:
    settings = PolicySettings()
    chain, prefill = measured_chain(settings, host=FAST_HOST), trained_engine()
    hits = [TierHit("host", 2048, 2048 * TOKEN_BYTES)]
    queued = verdicts.decide_chain(
        chain, prefill, settings, 0, hits, lambda resource: 2.0 if resource == ENGINE else 0.0
    )[0]
    assert queued.engine_wait_s == 2.0
    assert (
        verdicts.decide_chain(chain, prefill, settings, 0, hits, verdicts.idle)[0].engine_wait_s
        == 0
    )


def test_a_batch_verdict_counts_no_refusal_itself() -> None:
    settings = PolicySettings()
    chain, prefill = measured_chain(settings, disk=SLOW_DISK), trained_engine()
    hits = [BatchHit(0, 8192, 8192 * TOKEN_BYTES)] * 4
    decisions = verdicts.decide_batch(chain, prefill, settings, "disk", hits, verdicts.idle)
    assert len(decisions) == 4 and not any(d.restore for d in decisions)
    assert refusals(chain) == {"disk": 0}
