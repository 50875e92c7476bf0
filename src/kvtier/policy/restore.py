"""Per-tier restore estimate: fixed latency + bytes / bandwidth, learned from completed loads.

The model of one load of ``B`` bytes from a tier is ``t = latency_s + B / bandwidth``,
fitted online (``DecayingLeastSquares``: a moving average with a half-life in loads) from the
times the adapter reports, each from when the tier began on the load (its submission, or the
end of the loads queued ahead of it: ``RestorePolicy.end_load``) to its completion; waiting
behind other loads is the backlog's to predict (``kvtier.policy.backlog``). Before the first
load the estimate is the tier's prior, which should err slow (``RestorePrior``): a tier is then
refused until a measurement (a real load or a background probe) shows it is worth it, never
served on hope.

**No faster than measured.** Loads of one size cannot tell latency from bandwidth, and the
prior's large-load pseudo-observation then sets the slope: a slow disk seen only through 4 MB
loads can have most of each load's time put into latency and the prior's fast bandwidth taken
for the rest, so a load four times that size is predicted at half its real time, and a restore
several times slower than recomputing is taken. So once a tier is measured, a prediction is
never below its bytes at the
throughput the tier actually showed (decayed ``sum(seconds) / sum(bytes)`` of its loads, the
same half-life): the fit can only add latency, never promise more bandwidth than was seen.

**Slow mark.** A load that overruns its deadline marks the tier *slow*: predictions are
multiplied by an inflation factor (``slow_inflation``, doubled for each further overrun while
slow, at most ``slow_inflation_max``), and the overrun time itself (a lower bound of the true
time) enters the fit. The mark clears after ``recovery_loads`` consecutive loads complete
within their deadlines: fresh measurements, not the passing of time, say the tier is well
again. A tier refused for being slow gets those measurements from background probes
(``RestorePolicy.probe_due``), which cost no request anything.

**Recent loads.** The estimate keeps its last ``KEPT_LOADS`` measurements (``recent_loads``) so
an earlier process's can be replayed into a fresh one (``record``): the fit and the throughput
shown, not the slow mark, which is this process's own finding.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.policy.fit import DecayingLeastSquares, decay_for_half_life

GiB = float(1 << 30)

#: Load sizes at which the prior is written as pseudo-observations: one small and one large,
#: so the prior pins both the latency and the bandwidth.
_PRIOR_SIZES = (1 << 20, 1 << 30)

#: Measurements kept for replay: two half-lives of the default fit (8 loads).
KEPT_LOADS = 16


@dataclass(frozen=True)
class MeasuredLoad:
    """One load (or probe, or overrun) the estimate learned from."""

    #: Bytes the load moved.
    nbytes: int
    #: Measured seconds (for an overrun, the time until it was abandoned).
    seconds: float


@dataclass(frozen=True)
class RestorePrior:
    """What a tier is assumed to do before it is measured; choose it on the slow side."""

    #: Sustained bytes per second of one load (10^9 = 1 GB/s).
    bandwidth_bytes_per_s: float
    #: Fixed seconds per load (open, index, queueing), paid even for one block.
    latency_s: float

    def __post_init__(self) -> None:
        if not (self.bandwidth_bytes_per_s > 0 and math.isfinite(self.bandwidth_bytes_per_s)):
            raise ConfigError(
                f"policy: prior bandwidth_bytes_per_s={self.bandwidth_bytes_per_s}; "
                "give a positive rate such as 1e9 (1 GB/s)"
            )
        if not (self.latency_s >= 0 and math.isfinite(self.latency_s)):
            raise ConfigError(f"policy: prior latency_s={self.latency_s}; give >= 0, e.g. 0.005")

    def seconds(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth_bytes_per_s


#: A deliberately slow default: 1 GB/s and 5 ms per load. Slower than a host pool and than
#: most NVMe disks, faster than a congested network store; measurements replace it within a
#: few loads.
DEFAULT_RESTORE_PRIOR = RestorePrior(bandwidth_bytes_per_s=1e9, latency_s=0.005)


@dataclass(frozen=True)
class TierSnapshot:
    """A tier's estimate and health at one moment (for metrics and logs)."""

    name: str
    #: The bandwidth predictions of large loads use, bytes per second: the fit's, but never
    #: above the throughput the tier showed (inf only when neither bounds it).
    bandwidth_bytes_per_s: float
    #: The least-squares fit's own bandwidth (inf when it puts all cost in latency).
    fitted_bandwidth_bytes_per_s: float
    #: Fitted fixed seconds per load.
    latency_s: float
    #: Marked slow by an overrun, not yet recovered.
    slow: bool
    #: Factor applied to predictions (1.0 unless slow).
    inflation: float
    #: Loads (and probes) measured, overruns seen, loads refused by the decision.
    loads: int
    overruns: int
    refused: int
    #: Effective number of measurements behind the fit (prior excluded).
    evidence: float
    #: The largest recent load: predictions up to this size interpolate measurements.
    largest_load_bytes: int = 0


class TierEstimate:
    """Restore-time estimate and health of one tier. Not thread-safe (the policy locks)."""

    def __init__(
        self,
        name: str,
        prior: RestorePrior,
        *,
        prior_weight: float,
        half_life_loads: float,
        slow_inflation: float,
        slow_inflation_max: float,
        recovery_loads: int,
    ) -> None:
        self.name = name
        self.prior = prior
        rows = [((1.0, size / GiB), prior.seconds(size)) for size in _PRIOR_SIZES]
        self._fit = DecayingLeastSquares(rows, prior_weight, half_life_loads)
        self._decay = decay_for_half_life(half_life_loads)
        #: Decayed sums of measured seconds and bytes: the throughput the tier showed.
        self._seconds_seen = 0.0
        self._bytes_seen = 0.0
        self._slow_inflation = slow_inflation
        self._slow_inflation_max = slow_inflation_max
        self._recovery_loads = recovery_loads
        self.inflation = 1.0
        self.good_in_a_row = 0
        self.loads = 0
        self.overruns = 0
        self.refused = 0
        self._recent: deque[MeasuredLoad] = deque(maxlen=KEPT_LOADS)
        #: Measurements entered since the estimate was made (replayed ones too); only grows.
        self.measured = 0

    @property
    def slow(self) -> bool:
        return self.inflation > 1.0

    def base_seconds(self, nbytes: int) -> float:
        """Predicted seconds for a load of ``nbytes``, ignoring the slow mark."""
        latency, s_per_gib = self._fit.coefficients()  # cached until the next measurement
        fitted = latency + s_per_gib * nbytes / GiB
        if self._bytes_seen <= 0:
            return fitted
        return max(fitted, nbytes * self._seconds_seen / self._bytes_seen)

    def predict_seconds(self, nbytes: int) -> float:
        """Predicted seconds for a load of ``nbytes``, inflated while the tier is slow."""
        return self.base_seconds(nbytes) * self.inflation

    def record(self, nbytes: int, seconds: float) -> None:
        """Enter a measured time into the fit only (no effect on the slow mark)."""
        self._fit.observe((1.0, nbytes / GiB), max(seconds, 1e-9))
        if nbytes > 0:
            self._seconds_seen = self._seconds_seen * self._decay + max(seconds, 1e-9)
            self._bytes_seen = self._bytes_seen * self._decay + nbytes
        self.loads += 1
        self._recent.append(MeasuredLoad(nbytes, max(seconds, 1e-9)))
        self.measured += 1

    @property
    def largest_load_bytes(self) -> int:
        """The largest of the recent measured loads (0 before any): predictions for loads up
        to this size interpolate what was measured, larger ones extrapolate the bandwidth."""
        return max((load.nbytes for load in self._recent), default=0)

    def recent_loads(self) -> tuple[MeasuredLoad, ...]:
        """The last ``KEPT_LOADS`` measurements, oldest first."""
        return tuple(self._recent)

    def observe(self, nbytes: int, seconds: float, on_time: bool) -> None:
        """A load completed after ``seconds``; ``on_time``: within its deadline."""
        self.record(nbytes, seconds)
        if not on_time:
            self._mark_overrun()
            return
        if self.slow:
            self.good_in_a_row += 1
            if self.good_in_a_row >= self._recovery_loads:
                self.inflation = 1.0
                self.good_in_a_row = 0

    def overrun(self, nbytes: int, elapsed_s: float) -> None:
        """A load was abandoned at its deadline after ``elapsed_s`` (a lower bound)."""
        self.record(nbytes, elapsed_s)
        self.loads -= 1  # not a completed load; counted when its I/O returns (record)
        self._mark_overrun()

    def _mark_overrun(self) -> None:
        self.overruns += 1
        self.good_in_a_row = 0
        if self.slow:
            self.inflation = min(self.inflation * 2.0, self._slow_inflation_max)
        else:
            self.inflation = self._slow_inflation

    def snapshot(self) -> TierSnapshot:
        latency, s_per_gib = self._fit.coefficients()
        fitted = GiB / s_per_gib if s_per_gib > 0 else math.inf
        shown = self._bytes_seen / self._seconds_seen if self._bytes_seen > 0 else math.inf
        return TierSnapshot(
            name=self.name,
            bandwidth_bytes_per_s=min(fitted, shown),
            fitted_bandwidth_bytes_per_s=fitted,
            latency_s=latency,
            slow=self.slow,
            inflation=self.inflation,
            loads=self.loads,
            overruns=self.overruns,
            refused=self.refused,
            evidence=self._fit.data_weight,
            largest_load_bytes=self.largest_load_bytes,
        )
