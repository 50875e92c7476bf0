"""The policy's cost models: the online fit, the prefill model, the restore estimate.

Also the claim the decision rests on (restoring all of a hit or none of it is optimal) as a
property over random cost coefficients, and that the package stays pure Python.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvtier
from kvtier.errors import ConfigError
from kvtier.policy import (
    DEFAULT_PREFILL_PRIOR,
    PrefillCoefficients,
    PrefillModel,
    RestorePolicy,
    attended_pairs,
    calibration_points,
)
from kvtier.policy.fit import DecayingLeastSquares, decay_for_half_life

GIB = 1 << 30
TRUE = PrefillCoefficients(step_s=0.004, per_token_s=3e-5, per_pair_s=2e-10)
STEPS = [(0, 512), (0, 2048), (0, 8192), (0, 32768), (8192, 8192), (16384, 16384), (30720, 2048)]


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# -- the fit -------------------------------------------------------------------------------


def test_the_fit_recovers_exact_coefficients():
    fit = DecayingLeastSquares([((1.0, 1.0, 1.0), 1.0)], prior_weight=1e-6, half_life=16)
    truth = (0.5, 2.0, 0.25)
    for x in [(1.0, 1.0, 0.0), (1.0, 4.0, 2.0), (1.0, 9.0, 30.0), (1.0, 0.5, 100.0)]:
        fit.observe(x, sum(t * v for t, v in zip(truth, x, strict=True)))
    assert fit.coefficients() == pytest.approx(truth, rel=0.01)


def test_the_fit_never_returns_a_negative_coefficient():
    # Data that an unconstrained fit explains with a negative intercept.
    fit = DecayingLeastSquares([((1.0, 1.0), 1.0)], prior_weight=1e-3, half_life=16)
    for x, y in [((1.0, 1.0), 0.5), ((1.0, 2.0), 1.5), ((1.0, 3.0), 2.5)]:
        fit.observe(x, y)
    latency, slope = fit.coefficients()
    assert latency == 0.0
    assert slope > 0


def test_the_fit_is_the_prior_before_any_measurement():
    fit = DecayingLeastSquares([((1.0, 0.0), 2.0), ((1.0, 1.0), 5.0)], 1e-3, half_life=8)
    assert fit.coefficients() == pytest.approx((2.0, 3.0))
    assert fit.data_weight == 0


@pytest.mark.parametrize(
    ("old", "new", "rel"), [(3.0, 1.0, 0.05), (1.0, 1.5, 0.05), (1.0, 3.0, 0.3)]
)
def test_the_fit_follows_a_change_within_a_few_half_lives(old, new, rel):
    # Relative errors weigh fast measurements more: a speed-up is followed quickly, a 3x
    # slow-down lags (still 25% short after four half-lives; the deadline catches gross ones).
    fit = DecayingLeastSquares([((1.0,), 1.0)], prior_weight=1e-6, half_life=4)
    for _ in range(40):
        fit.observe((1.0,), old)
    for _ in range(16):  # four half-lives of the new regime
        fit.observe((1.0,), new)
    assert fit.coefficients()[0] == pytest.approx(new, rel=rel)


def test_the_fit_weighs_errors_relatively():
    # A 1 ms and a 1 s measurement of the same constant, each 10% off in opposite directions:
    # a relative fit lands near 1 ms for the small one's sake as much as for the big one's.
    fit = DecayingLeastSquares([((1.0, 0.0), 1.0)], prior_weight=1e-9, half_life=1000)
    for x, y in [((1.0, 0.0), 0.0011), ((0.0, 1.0), 0.9), ((1.0, 0.0), 0.0009), ((0.0, 1.0), 1.1)]:
        fit.observe(x, y)
    small, big = fit.coefficients()
    assert small == pytest.approx(0.001, rel=0.02)
    assert big == pytest.approx(1.0, rel=0.02)


@pytest.mark.parametrize("half_life", [0, -1, float("inf")])
def test_a_bad_half_life_is_refused(half_life):
    with pytest.raises(ConfigError, match="half_life"):
        decay_for_half_life(half_life)


def test_a_measurement_must_be_positive():
    fit = DecayingLeastSquares([((1.0,), 1.0)], prior_weight=1e-3, half_life=4)
    with pytest.raises(ValueError, match="must be positive"):
        fit.observe((1.0,), 0.0)


# -- the prefill model ---------------------------------------------------------------------


@pytest.mark.parametrize(("cached", "new", "pairs"), [(0, 4, 8), (10, 4, 48), (1000, 1, 1000.5)])
def test_attended_pairs_counts_causal_query_key_pairs(cached, new, pairs):
    # n * (2m + n) / 2: each new token attends to the m cached ones and to the new ones
    # before it (counting itself as half, the continuous approximation).
    assert attended_pairs(cached, new) == pairs


def test_a_cached_prefix_makes_the_same_new_tokens_dearer():
    model = PrefillModel(TRUE)
    extra = TRUE.per_pair_s * 30000 * 2048  # attention to the cached prefix
    assert model.recompute_seconds(30000, 2048) == pytest.approx(
        model.recompute_seconds(0, 2048) + extra
    )


def test_the_prefill_model_learns_the_engines_coefficients():
    model = PrefillModel()
    for m, n in STEPS:
        assert model.observe_step([(m, n)], TRUE.step_seconds([(m, n)]))
    got = model.coefficients()
    assert got.per_token_s == pytest.approx(TRUE.per_token_s, rel=0.05)
    assert got.per_pair_s == pytest.approx(TRUE.per_pair_s, rel=0.05)
    for m, n in [(0, 100_000), (60_000, 4096)]:
        want = TRUE.per_token_s * n + TRUE.per_pair_s * attended_pairs(m, n)
        assert model.recompute_seconds(m, n) == pytest.approx(want, rel=0.05)


def test_one_measured_step_overrides_a_far_off_prior():
    # A real prompt 80x slower than the default prior: recompute must not stay predicted cheap.
    model = PrefillModel()
    slow = PrefillCoefficients(step_s=0.0, per_token_s=4e-4, per_pair_s=0.0)
    model.observe_step([(0, 2048)], slow.step_seconds([(0, 2048)]))
    assert model.recompute_seconds(0, 2048) == pytest.approx(0.8192, rel=0.05)


@pytest.mark.parametrize(
    "engine",
    [
        PrefillCoefficients(0.0, per_token_s=3e-5, per_pair_s=2e-10),  # mostly per token
        PrefillCoefficients(0.0, per_token_s=1e-6, per_pair_s=5e-9),  # mostly attention
    ],
    ids=["per-token", "attention"],
)
def test_steps_of_one_shape_never_predict_another_length_dearer_than_it_is(engine):
    """Every step an 8k prompt from token 0: the steps pin what such a prompt costs, not how
    much of it is attention. Other lengths are predicted by the cheaper of the two splits
    the steps allow, so at most what they cost, whichever split the engine has."""
    model = PrefillModel()
    for _ in range(8):
        model.observe_step([(0, 8192)], engine.step_seconds([(0, 8192)]))
    assert not model.split_known
    eight_k = model.recompute_seconds(0, 8192)
    assert eight_k == pytest.approx(engine.step_seconds([(0, 8192)]), rel=1e-3)
    assert model.recompute_seconds(0, 2048) == pytest.approx(eight_k / 16)  # all attention
    assert model.recompute_seconds(0, 32768) == pytest.approx(eight_k * 4)  # no growth
    for m, n in [(0, 512), (0, 2048), (0, 32768), (8192, 8192), (30000, 2048), (1024, 4096)]:
        truth = engine.per_token_s * n + engine.per_pair_s * attended_pairs(m, n)
        assert model.recompute_seconds(m, n) <= truth * (1 + 1e-3), (m, n)


def test_steps_of_two_lengths_or_a_calibration_tell_the_split():
    model = PrefillModel()
    for m, n in [(0, 8192), (0, 8192), (0, 6144)]:  # 4096 and 3072 tokens back: too close
        model.observe_step([(m, n)], TRUE.step_seconds([(m, n)]))
    assert not model.split_known
    model.observe_step([(0, 2048)], TRUE.step_seconds([(0, 2048)]))
    assert model.split_known
    c = model.coefficients()
    assert model.recompute_seconds(0, 65536) == pytest.approx(
        c.per_token_s * 65536 + c.per_pair_s * attended_pairs(0, 65536)
    )
    calibrated = PrefillModel()
    calibrated.calibrate([(m, n, TRUE.step_seconds([(m, n)])) for m, n in calibration_points(8192)])
    assert calibrated.split_known
    assert PrefillModel().split_known  # the prior alone: nothing measured to doubt


def test_the_prefill_model_fits_batched_steps():
    model = PrefillModel()
    batches = [[(0, 512), (4096, 1024)], [(0, 8192)], [(16384, 2048), (0, 4096), (1000, 1)]]
    batches += [[(m, n)] for m, n in STEPS]
    for segments in batches:
        model.observe_step(segments, TRUE.step_seconds(segments))
    assert model.step_seconds([(2048, 2048), (0, 100)]) == pytest.approx(
        TRUE.step_seconds([(2048, 2048), (0, 100)]), rel=0.05
    )


def test_decode_steps_and_tiny_steps_are_ignored():
    model = PrefillModel(min_step_tokens=16)
    before = model.coefficients()
    assert not model.observe_step([(5000, 1)] * 64, 0.5)  # pure decode, however many requests
    assert not model.observe_step([(0, 8)], 0.5)  # below min_step_tokens
    assert not model.observe_step([(0, 512)], float("nan"))
    assert model.coefficients() == before
    assert model.evidence == 0


def test_the_default_prefill_prior_is_fast():
    # 5 us a token and no attention cost: faster than any engine the evidence measured.
    model = PrefillModel()
    got = model.coefficients()
    assert got.per_token_s == pytest.approx(DEFAULT_PREFILL_PRIOR.per_token_s)
    assert got.per_pair_s == pytest.approx(0.0, abs=1e-18)
    assert model.recompute_seconds(0, 32768) == pytest.approx(32768 * 5e-6)


def test_calibration_seeds_the_model_before_any_step():
    model = PrefillModel()
    samples = [(m, n, TRUE.step_seconds([(m, n)])) for m, n in calibration_points(32768)]
    got = model.calibrate(samples)
    assert got.per_token_s == pytest.approx(TRUE.per_token_s, rel=0.05)
    assert got.per_pair_s == pytest.approx(TRUE.per_pair_s, rel=0.05)
    assert model.evidence == 0  # a calibration is a prior, measured steps still come first


def test_the_prefill_reach_is_the_longest_context_measured_or_calibrated():
    model = PrefillModel()
    assert model.reach_tokens == 0
    model.calibrate([(m, n, TRUE.step_seconds([(m, n)])) for m, n in calibration_points(8192)])
    assert model.reach_tokens == 8192
    model.observe_step([(0, 2048), (16384, 4096)], 0.5)
    assert model.reach_tokens == 20480
    model.observe_step([(0, 1)], 0.01)  # a decode step: ignored, and no reach either
    assert model.reach_tokens == 20480


def test_calibration_points_stay_within_the_model_length():
    points = calibration_points(8192)
    assert all(m + n <= 8192 for m, n in points)
    assert any(m > 0 for m, _ in points), "one point needs a cached prefix (attention cost)"
    with pytest.raises(ConfigError, match="max_model_len=10"):
        calibration_points(10)


def test_chunked_prefill_charges_the_extra_steps():
    plain = PrefillModel(TRUE)
    chunked = PrefillModel(TRUE, max_step_tokens=2048)
    assert chunked.recompute_seconds(0, 8192) == pytest.approx(
        plain.recompute_seconds(0, 8192) + 4 * TRUE.step_s, rel=1e-3
    )


def test_recomputing_nothing_costs_nothing():
    assert PrefillModel(TRUE).recompute_seconds(5000, 0) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"step_s": -1.0, "per_token_s": 1e-5, "per_pair_s": 0.0}, "step_s=-1.0"),
        ({"step_s": 0.0, "per_token_s": 0.0, "per_pair_s": 0.0}, "both 0"),
    ],
)
def test_bad_prefill_coefficients_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        PrefillCoefficients(**kwargs)


# -- the restore estimate ------------------------------------------------------------------


def test_the_restore_estimate_separates_latency_from_bandwidth():
    policy = RestorePolicy(clock=FakeClock())
    policy.add_tier("disk")
    for nbytes in (1 << 20, 16 << 20, 256 << 20, GIB) * 2:
        policy.observe_load("disk", nbytes, 0.004 + nbytes / 2.5e9)
    tier = policy.snapshot().tiers["disk"]
    assert tier.fitted_bandwidth_bytes_per_s == pytest.approx(2.5e9, rel=0.03)
    assert tier.latency_s == pytest.approx(0.004, rel=0.05)
    assert tier.loads == 8


def test_a_tiers_evidence_reaches_its_largest_recent_load():
    policy = RestorePolicy(clock=FakeClock())
    policy.add_tier("disk")
    assert policy.snapshot().tiers["disk"].loads == 0
    for nbytes in (GIB, 1 << 20):
        policy.observe_load("disk", nbytes, nbytes / 2e9)
    assert policy.snapshot().tiers["disk"].largest_load_bytes == GIB


# -- the claim behind all-or-nothing -------------------------------------------------------


def plan_cost(model: PrefillModel, latency: float, per_token: float, m: int, n: int, k: int):
    """Restore the first k tokens of a hit [m, m+n), recompute the rest."""
    restore = (latency + per_token * k) if k else 0.0
    return restore + model.recompute_seconds(m + k, n - k)


@given(
    per_token_s=st.floats(1e-7, 1e-3),
    per_pair_s=st.floats(0.0, 1e-8),
    latency_s=st.floats(0.0, 1.0),
    restore_per_token_s=st.floats(1e-7, 1e-3),
    m=st.integers(0, 100_000),
    n=st.integers(1, 400),
)
@settings(max_examples=300, deadline=None)
def test_restoring_all_or_nothing_of_a_hit_is_optimal(
    per_token_s, per_pair_s, latency_s, restore_per_token_s, m, n
):
    model = PrefillModel(PrefillCoefficients(0.0, per_token_s, per_pair_s))
    costs = [plan_cost(model, latency_s, restore_per_token_s, m, n, k) for k in range(n + 1)]
    best_end = min(costs[0], costs[-1])
    assert min(costs) >= best_end * (1 - 1e-9) - 1e-15


# -- purity --------------------------------------------------------------------------------


def test_the_policy_imports_neither_vllm_nor_torch_nor_the_benches():
    code = (
        "import sys, kvtier.policy; "
        "bad = [m for m in ('torch', 'vllm', 'numpy', 'kvtier.bench', 'benchmarks') "
        "if m in sys.modules]; print(bad)"
    )
    # The child finds kvtier where this process did (pytest's pythonpath does not reach it).
    src = str(Path(kvtier.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.strip() == "[]"
