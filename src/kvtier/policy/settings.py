"""The decision's settings: one frozen dataclass, validated once, with defaults that work."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvtier.errors import ConfigError
from kvtier.policy.deadline import DeadlineRule


@dataclass(frozen=True)
class PolicySettings:
    """Restore-or-recompute decision and load deadlines (kvtier.policy.RestorePolicy)."""

    #: The decision switch. False: every hit is restored (deadlines still apply).
    enabled: bool = True
    #: A restore is chosen only if predicted faster by this factor (>= 1): estimates are noisy
    #: and a wrong "restore" costs the request, a wrong "recompute" only a missed gain.
    safety_factor: float = 1.2
    #: How long one load may run before it is abandoned.
    deadline: DeadlineRule = field(default_factory=DeadlineRule)
    #: Factor on a tier's predictions after its first overrun; doubled for each further one.
    slow_inflation: float = 4.0
    #: Largest factor a run of overruns can reach.
    slow_inflation_max: float = 64.0
    #: Consecutive on-time loads (or probes) that clear a tier's slow mark.
    recovery_loads: int = 3
    #: Seconds between background probes of a slow or never-measured tier.
    probe_interval_s: float = 10.0
    #: Loads after which a measurement's weight in a tier's estimate has halved.
    half_life_loads: float = 8.0
    #: Measurements a tier's prior is worth. Tiny on purpose: the prior decides alone only
    #: until the first measurement, then merely settles what the data cannot tell apart.
    prior_weight: float = 1e-6

    def __post_init__(self) -> None:
        def bad(name: str, hint: str) -> ConfigError:
            return ConfigError(f"policy: {name}={getattr(self, name)!r}; {hint}")

        if not isinstance(self.enabled, bool):
            raise bad("enabled", "give true or false")
        if not (self.safety_factor >= 1 and math.isfinite(self.safety_factor)):
            raise bad("safety_factor", "give a number >= 1, e.g. 1.2")
        if not isinstance(self.deadline, DeadlineRule):
            raise bad("deadline", "give a DeadlineRule")
        if not (self.slow_inflation > 1 and math.isfinite(self.slow_inflation)):
            raise bad("slow_inflation", "give a number > 1, e.g. 4")
        top = self.slow_inflation_max
        if not (top >= self.slow_inflation and math.isfinite(top)):
            raise bad(
                "slow_inflation_max", f"give a number >= slow_inflation {self.slow_inflation}"
            )
        if not (isinstance(self.recovery_loads, int) and self.recovery_loads >= 1):
            raise bad("recovery_loads", "give an integer >= 1, e.g. 3")
        if not (self.probe_interval_s > 0 and math.isfinite(self.probe_interval_s)):
            raise bad("probe_interval_s", "give seconds > 0, e.g. 10")
        if not (self.half_life_loads > 0 and math.isfinite(self.half_life_loads)):
            raise bad("half_life_loads", "give a number of loads > 0, e.g. 8")
        if not (self.prior_weight > 0 and math.isfinite(self.prior_weight)):
            raise bad("prior_weight", "give a number > 0, e.g. 1e-6")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> PolicySettings:
        """Build from plain data (e.g. ``kv_connector_extra_config``); unknown keys refused.

        Deadline keys are flat: ``deadline_ceiling_s``, ``deadline_multiplier``,
        ``deadline_floor_s``.
        """
        deadline_keys = {"deadline_ceiling_s": "ceiling_s", "deadline_multiplier": "multiplier",
                         "deadline_floor_s": "floor_s"}  # fmt: skip
        own = {f.name for f in dataclasses.fields(cls) if f.name != "deadline"}
        known = sorted(own | set(deadline_keys))
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(f"policy: unknown option(s) {unknown}; known: {known}")
        deadline = DeadlineRule(
            **{deadline_keys[k]: float(v) for k, v in values.items() if k in deadline_keys}
        )
        return cls(deadline=deadline, **{k: v for k, v in values.items() if k in own})
