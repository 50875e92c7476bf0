"""The decision's settings: one frozen model, validated once, with defaults that work."""

from __future__ import annotations

from typing import ClassVar, Self

from pydantic import Field, model_validator

from kvtier.policy.deadline import DeadlineRule
from kvtier.settings import SettingsModel, with_fix


class PolicySettings(SettingsModel):
    """Restore-or-recompute decision and load deadlines (kvtier.policy.RestorePolicy)."""

    component: ClassVar[str] = "policy"

    #: The decision switch. False: every hit is restored (deadlines still apply).
    enabled: bool = Field(default=True, strict=True, **with_fix("give true or false"))
    #: A restore is chosen only if predicted faster by this factor (>= 1): estimates are noisy
    #: and a wrong "restore" costs the request, a wrong "recompute" only a missed gain.
    safety_factor: float = Field(
        default=1.2, ge=1, allow_inf_nan=False, **with_fix("give a number >= 1, e.g. 1.2")
    )
    #: The factor used instead where a prediction interpolates what was measured: the hit no
    #: larger than the tier's recent loads (and its ``via`` tier's), the prompt no longer than
    #: the longest the engine's prefill was measured on, the tier not writing. There the
    #: fitted models came within a few percent, and a missed gain should cost at most 5 %, the
    #: bound the decision is held to (docs/gpu-evidence.md). Beyond the evidence a prediction
    #: extrapolates (attention's quadratic cost, a tier's throughput on sizes it never read,
    #: a disk shared with write-back) and ``safety_factor`` applies. The smaller of the two is
    #: used here.
    safety_factor_within_evidence: float = Field(
        default=1.05, ge=1, allow_inf_nan=False, **with_fix("give a number >= 1, e.g. 1.05")
    )
    #: How long one load may run before it is abandoned.
    deadline: DeadlineRule = Field(default_factory=DeadlineRule, **with_fix("give a DeadlineRule"))
    #: Factor on a tier's predictions after its first overrun; doubled for each further one.
    slow_inflation: float = Field(
        default=4.0, gt=1, allow_inf_nan=False, **with_fix("give a number > 1, e.g. 4")
    )
    #: Largest factor a run of overruns can reach (>= slow_inflation).
    slow_inflation_max: float = Field(
        default=64.0, gt=1, allow_inf_nan=False, **with_fix("give a number >= slow_inflation")
    )
    #: Consecutive on-time loads (or probes) that clear a tier's slow mark.
    recovery_loads: int = Field(
        default=3, ge=1, strict=True, **with_fix("give an integer >= 1, e.g. 3")
    )
    #: Seconds between background probes of a slow or never-measured tier.
    probe_interval_s: float = Field(
        default=10.0, gt=0, allow_inf_nan=False, **with_fix("give seconds > 0, e.g. 10")
    )
    #: Loads after which a measurement's weight in a tier's estimate has halved.
    half_life_loads: float = Field(
        default=8.0, gt=0, allow_inf_nan=False, **with_fix("give a number of loads > 0, e.g. 8")
    )
    #: Measurements a tier's prior is worth. Tiny on purpose: the prior decides alone only
    #: until the first measurement, then merely settles what the data cannot tell apart.
    prior_weight: float = Field(
        default=1e-6, gt=0, allow_inf_nan=False, **with_fix("give a number > 0, e.g. 1e-6")
    )

    @model_validator(mode="after")
    def _inflation_cap_above_its_start(self) -> Self:
        if self.slow_inflation_max < self.slow_inflation:
            raise ValueError(
                f"slow_inflation_max={self.slow_inflation_max}; give a number >= "
                f"slow_inflation {self.slow_inflation}"
            )
        return self
