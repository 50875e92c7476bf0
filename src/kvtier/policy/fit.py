"""Online least squares with forgetting, non-negative coefficients and a prior.

Both cost models of the policy are linear in a few non-negative coefficients (a restore:
fixed latency + bytes / bandwidth; a prefill step: fixed cost + per token + per attended pair),
fitted online from measurements that drift (a disk fills up, a neighbour starts reading). So:

* **Exponential forgetting.** Each new observation multiplies the weight of the older ones by
  ``decay`` (set from a half-life in observations): the fit is a moving average that follows a
  change within a few half-lives and never stops learning. Only sufficient statistics are
  kept (a few sums), so an update is O(1).
* **Relative errors.** Each row is weighted by ``1 / y**2``: the fit minimises relative, not
  absolute, error, so a 5 ms step and a 5 s step count alike (otherwise one long prefill would
  dominate and short steps would be predicted badly). Relative error is asymmetric (an
  underprediction costs at most 1, an overprediction without bound), which biases a noisy fit
  slightly low; a symmetric weighting ``1 / (y * y_hat)`` was tried and dropped: its natural
  reweighting converges to a harmonic mean, not to the minimiser, and the correct
  reweighting oscillated.
* **A prior as pseudo-observations.** The prior is a few (features, seconds) rows that never
  decay, worth ``prior_weight`` observations in all. Before the first measurement the fit
  *is* the prior; afterwards it only settles what the data cannot tell apart (every load the
  same size, say). Its weight must be tiny: under relative error a prior row far below the
  truth is stiff (80x off costs 6,000 units), and with a weight of 0.05 one real prefill step
  80x slower than the default prior was still fitted 3x too fast. The policy uses 1e-6.
  Rejected alternative: ridge regularisation towards the prior, whose strength depends on
  feature scales.
* **Non-negative coefficients.** A negative latency or per-token cost is never physical; each
  solve minimises over the non-negative orthant exactly: the unconstrained solution when it is
  feasible, else the best of every subset of free coefficients (at most 6 small systems).

Pure Python, no numpy: it runs under the policy's lock, on a few floats; the solution is
cached until the next observation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from kvtier.errors import ConfigError

#: Relative size of the diagonal nudge that keeps a singular system solvable.
_JITTER = 1e-12


def decay_for_half_life(half_life: float) -> float:
    """Per-observation decay factor under which a weight halves after ``half_life`` updates."""
    if not (half_life > 0 and math.isfinite(half_life)):
        raise ConfigError(f"policy: half_life={half_life}; give a positive number of updates")
    return 0.5 ** (1.0 / half_life)


class DecayingLeastSquares:
    """Fit ``y ~ x . theta`` with ``theta >= 0``: forgetting, relative errors, a prior.

    Not thread-safe: the owner serialises calls (the policy holds one lock for all models).
    """

    def __init__(
        self,
        prior_rows: Sequence[tuple[Sequence[float], float]],
        prior_weight: float,
        half_life: float,
    ) -> None:
        """``prior_rows``: (features, seconds) pseudo-observations sharing ``prior_weight``."""
        if not prior_rows:
            raise ConfigError("policy: a fit needs at least one prior row")
        self.n = len(prior_rows[0][0])
        self.decay = decay_for_half_life(half_life)
        self._data_a = [[0.0] * self.n for _ in range(self.n)]
        self._data_b = [0.0] * self.n
        self._data_weight = 0.0
        self._prior_a = [[0.0] * self.n for _ in range(self.n)]
        self._prior_b = [0.0] * self.n
        self._cached: tuple[float, ...] | None = None
        self.set_prior(prior_rows, prior_weight)

    def set_prior(self, rows: Sequence[tuple[Sequence[float], float]], weight: float) -> None:
        """Replace the prior with ``rows`` worth ``weight`` observations in all."""
        if not (weight > 0 and math.isfinite(weight)):
            raise ConfigError(f"policy: prior weight={weight}; give a positive number")
        self._prior_a = [[0.0] * self.n for _ in range(self.n)]
        self._prior_b = [0.0] * self.n
        for x, y in rows:
            self._check(x, y)
            _accumulate(self._prior_a, self._prior_b, x, y, weight / len(rows))
        self._cached = None

    def observe(self, x: Sequence[float], y: float) -> None:
        """Add one measurement (features ``x``, seconds ``y > 0``); older ones fade."""
        self._check(x, y)
        for i in range(self.n):
            self._data_b[i] *= self.decay
            for j in range(self.n):
                self._data_a[i][j] *= self.decay
        self._data_weight = self._data_weight * self.decay + 1.0
        _accumulate(self._data_a, self._data_b, x, y, 1.0)
        self._cached = None

    @property
    def data_weight(self) -> float:
        """Effective number of measurements behind the fit (saturates at 1 / (1 - decay))."""
        return self._data_weight

    def coefficients(self) -> tuple[float, ...]:
        """The non-negative ``theta`` minimising the weighted relative squared error."""
        if self._cached is None:
            a = [[self._prior_a[i][j] + self._data_a[i][j] for j in range(self.n)]
                 for i in range(self.n)]  # fmt: skip
            b = [self._prior_b[i] + self._data_b[i] for i in range(self.n)]
            self._cached = _nnls(a, b)
        return self._cached

    def _check(self, x: Sequence[float], y: float) -> None:
        if len(x) != self.n:
            raise ValueError(f"policy: {len(x)} features given, the fit has {self.n}")
        if not (y > 0 and math.isfinite(y)):
            raise ValueError(f"policy: measured time {y!r} s must be positive and finite")


def _accumulate(
    a: list[list[float]], b: list[float], x: Sequence[float], y: float, weight: float
) -> None:
    w = weight / (y * y)
    for i in range(len(x)):
        b[i] += w * x[i] * y
        for j in range(len(x)):
            a[i][j] += w * x[i] * x[j]


def _nnls(a: list[list[float]], b: list[float]) -> tuple[float, ...]:
    """Exact non-negative least squares from the normal equations ``a theta = b``."""
    n = len(b)
    full = _solve(a, b)
    if full is not None and min(full) >= 0:
        return tuple(full)  # the unconstrained optimum is feasible: the usual case
    best: tuple[float, ...] = (0.0,) * n
    best_cost = 0.0  # objective of theta = 0
    for size in range(1, n):
        for free in itertools.combinations(range(n), size):
            sub = _solve([[a[i][j] for j in free] for i in free], [b[i] for i in free])
            if sub is None or min(sub) < 0:
                continue
            theta = [0.0] * n
            for k, i in enumerate(free):
                theta[i] = sub[k]
            cost = _objective(a, b, theta)
            if cost < best_cost:
                best, best_cost = tuple(theta), cost
    return best


def _objective(a: list[list[float]], b: list[float], theta: list[float]) -> float:
    """theta' A theta - 2 b' theta: the weighted squared error up to a constant."""
    n = len(theta)
    quad = sum(theta[i] * a[i][j] * theta[j] for i in range(n) for j in range(n))
    return quad - 2.0 * sum(b[i] * theta[i] for i in range(n))


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Solve the small symmetric system ``a x = b``; None when it is (numerically) singular.

    Columns are scaled to a unit diagonal first: the features span many orders of magnitude
    (one vs. millions of token pairs) and would otherwise lose all precision.
    """
    n = len(b)
    scale = [1.0 / math.sqrt(a[i][i]) if a[i][i] > 0 else 0.0 for i in range(n)]
    if 0.0 in scale:
        return None
    m = [[a[i][j] * scale[i] * scale[j] for j in range(n)] + [b[i] * scale[i]] for i in range(n)]
    for i in range(n):
        m[i][i] += _JITTER
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < 1e-12:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(n):
            if r != col:
                f = m[r][col] / m[col][col]
                for c in range(col, n + 1):
                    m[r][c] -= f * m[col][c]
    return [m[i][n] / m[i][i] * scale[i] for i in range(n)]
