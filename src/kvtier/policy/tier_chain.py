"""The tiers the decision knows: each one's estimate, the tier its restores pass through, and
whether it is writing now.

A restore from a tier may also pay another tier's copy (a disk tier's loads land in the host
pool and then take the host pool's copy to the engine): such a tier is added ``via`` the
other, and its predictions add the other's. ``TierChain`` answers the two questions every
verdict asks of the tiers: how long a restore of so many bytes takes (``predict_s``), and by
how much it must beat recompute (``margin``, the safety rule of
``kvtier.policy.verdicts``).

Not thread-safe on its own: ``RestorePolicy`` calls it under its lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.policy.restore import DEFAULT_RESTORE_PRIOR, RestorePrior, TierEstimate
from kvtier.policy.settings import PolicySettings


@dataclass
class _Tier:
    estimate: TierEstimate
    #: Tier whose copy this tier's restores also pass through, or None.
    via: str | None
    #: Whether the tier is writing now, or None where it cannot tell.
    writing: Callable[[], bool] | None
    #: Policy-clock time of the tier's last measurement or claimed probe.
    last_evidence_s: float = -math.inf


class TierChain:
    """Every tier of one engine, by name, in the order they were added."""

    def __init__(self, settings: PolicySettings) -> None:
        self._settings = settings
        self._tiers: dict[str, _Tier] = {}

    def add(
        self,
        name: str,
        prior: RestorePrior = DEFAULT_RESTORE_PRIOR,
        via: str | None = None,
        writing: Callable[[], bool] | None = None,
    ) -> None:
        """Register ``name`` (``RestorePolicy.add_tier`` says what each argument means)."""
        if name in self._tiers:
            raise ConfigError(f"policy: tier {name!r} added twice; give each tier one name")
        if via is not None and via not in self._tiers:
            raise ConfigError(
                f"policy: tier {name!r} via={via!r}, which is not a tier yet; add it first"
            )
        s = self._settings
        estimate = TierEstimate(
            name,
            prior,
            prior_weight=s.prior_weight,
            half_life_loads=s.half_life_loads,
            slow_inflation=s.slow_inflation,
            slow_inflation_max=s.slow_inflation_max,
            recovery_loads=s.recovery_loads,
        )
        self._tiers[name] = _Tier(estimate, via, writing)

    def estimate(self, name: str) -> TierEstimate:
        """The estimate of ``name``; ``ConfigError`` for a tier never added."""
        return self._tier(name).estimate

    def estimates(self) -> Iterator[tuple[str, TierEstimate]]:
        """Every tier's name and estimate, in the order they were added."""
        return ((name, tier.estimate) for name, tier in self._tiers.items())

    def get(self, name: str) -> TierEstimate | None:
        """The estimate of ``name``, or None for a tier this chain does not have."""
        tier = self._tiers.get(name)
        return None if tier is None else tier.estimate

    def last_evidence_s(self, name: str) -> float:
        """Policy-clock time of ``name``'s last measurement or claimed probe."""
        return self._tier(name).last_evidence_s

    def note_evidence(self, name: str, now: float) -> None:
        """``name`` was measured, or a probe of it was claimed, at ``now``."""
        self._tier(name).last_evidence_s = now

    def predict_s(self, name: str, nbytes: int, *, slow_mark: bool = True) -> float:
        """Predicted seconds to restore ``nbytes`` from ``name``: its own load, slow mark
        included unless ``slow_mark`` is False, plus the copy of every tier it passes
        through."""
        tier = self._tier(name)
        estimate = tier.estimate
        seconds = estimate.predict_seconds(nbytes) if slow_mark else estimate.base_seconds(nbytes)
        if tier.via is None:
            return seconds
        return seconds + self.predict_s(tier.via, nbytes, slow_mark=slow_mark)

    def margin(
        self, loads: Iterable[tuple[str, int]], context_end: int, reach_tokens: int
    ) -> float:
        """How much faster than recompute a restore of these ``(tier, bytes)`` loads must be
        predicted, for a prompt of ``context_end`` tokens, the prefill model having been
        measured up to ``reach_tokens`` (``kvtier.policy.verdicts``, "Safety"):
        ``safety_factor_within_evidence`` when every prediction involved interpolates
        measurements and no tier loaded from is writing, else ``safety_factor``."""
        s = self._settings
        if context_end > reach_tokens:
            return s.safety_factor
        for name, nbytes in loads:
            tier = self._tier(name)
            if nbytes > tier.estimate.largest_load_bytes:
                return s.safety_factor
            if tier.writing is not None and tier.writing():
                return s.safety_factor
            via = tier.via
            while via is not None:
                # A via tier nothing measures (the host pool's copy to the GPU on CUDA) is
                # predicted by its prior, which errs slow: it can only cost a missed gain.
                largest = self._tier(via).estimate.largest_load_bytes
                if 0 < largest < nbytes:
                    return s.safety_factor
                via = self._tier(via).via
        return min(s.safety_factor_within_evidence, s.safety_factor)

    def _tier(self, name: str) -> _Tier:
        try:
            return self._tiers[name]
        except KeyError:
            known = sorted(self._tiers)
            raise ConfigError(
                f"policy: unknown tier {name!r}; known: {known}; call add_tier first"
            ) from None
