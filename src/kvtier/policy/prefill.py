"""Engine prefill cost as a function of context length, fitted online from measured steps.

One engine step computes, for each scheduled request, ``n`` new tokens over ``m`` tokens
whose KV is already there. Its time is modelled as

    t = a + b * sum(n) + c * sum(n * (2m + n) / 2)

``a``: fixed cost of a step (launches, weights read once, scheduling, sampling); ``b``: work
per token that does not depend on the context (projections, MLP, norms: dominant at short
contexts); ``c``: attention work per attended (query, key) pair; ``n * (2m + n) / 2`` counts
the pairs of causal attention when ``m`` tokens are cached, so long contexts cost
quadratically. All three are non-negative and fitted by ``DecayingLeastSquares`` (relative
errors, forgetting, a prior as pseudo-observations); the adapter feeds it the wall time of
each step that computed prompt tokens (``observe_step``).

**Recomputing a hit.** Tokens ``[m, m + n)`` that a tier could restore would otherwise be
computed in the steps that compute the rest of the prompt, which happen anyway: the step cost
``a`` is paid in both cases, so the recompute cost of the hit is ``b*n + c*n*(2m+n)/2``
(``recompute_seconds``), plus ``a`` for each extra step chunked prefill needs when
``max_step_tokens`` is known.

**Prior.** The default prior says prefill is fast (``DEFAULT_PREFILL_PRIOR``: 5 us per token
and no attention cost, i.e. 200k tokens/s at any length). That is conservative for the
decision: an underestimate of recompute can only refuse a restore that would have helped,
never choose one that is slower than recompute. The first measured prompt step replaces it;
``calibrate`` seeds it from a short calibration run before the first request.

**Steps all of one shape.** A step's cost pins ``b + c * r`` per token, where ``r`` is the
mean position its tokens attend up to (``mean_attended_position``). While every step the model
learned from has about the same ``r`` (an engine whose prompts are all one length, never
chunked), the steps cannot tell ``b`` from ``c``: the fit then splits them by its prior, which
once put the whole cost on attention, 4x too cheap at a quarter of the length and 4x too dear
at four times it. So when the positions measured span less than ``SPLIT_SPAN``, a recompute
is predicted as the cheaper of the two splits that agree with the steps: no attention growth
beyond the longest position measured, and all of it below the shortest. That errs towards
recomputing, which costs a missed gain at worst; one prompt of another length ends it.

**Recent steps.** The model keeps its last ``KEPT_STEPS`` measured steps (``recent_steps``), so
an earlier process's measurements can be replayed into a fresh one (``observe_step`` on each,
oldest first: they then fade under new measurements like any other). The fit itself keeps only
sums, which could not be trimmed or checked when read back.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvtier.errors import ConfigError
from kvtier.policy.fit import DecayingLeastSquares

#: Feature units: thousands of tokens and millions of pairs keep the numbers moderate.
_TOKENS_UNIT = 1e3
_PAIRS_UNIT = 1e6

#: (cached, new) points at which a prior is written as pseudo-observations: short and long
#: prompts with and without a cached prefix, so all three coefficients are pinned.
_PRIOR_POINTS = ((0, 128), (0, 2048), (0, 16384), (8192, 8192), (30720, 2048))

#: Measured steps kept for replay: two half-lives of the default fit (32 steps), past which a
#: step weighs less than a quarter of the newest one.
KEPT_STEPS = 64

#: How far apart (longest over shortest) the mean attended positions of the measured steps
#: must lie for the fit to tell the per-token cost from the attention cost (module
#: docstring, "Steps all of one shape"). Prompts of 2k and 8k tokens (4x) do; 6k and 8k do not.
SPLIT_SPAN = 2.0

#: Prefill measurements (steps) the fit needs before the decision may refuse a restore.
MIN_PREFILL_EVIDENCE = 2.0


def attended_pairs(cached: int, new: int) -> float:
    """Query-key pairs of causal attention for ``new`` tokens after ``cached`` ones."""
    return new * (2 * cached + new) / 2


def tokens_and_pairs(segments: Sequence[tuple[int, int]]) -> tuple[int, float]:
    """New tokens and attended pairs of one step's ``(cached, new)`` segments."""
    tokens = sum(n for _, n in segments)
    return tokens, sum(attended_pairs(m, n) for m, n in segments)


def mean_attended_position(segments: Sequence[tuple[int, int]]) -> float:
    """Attended pairs per new token of a step: how far back its tokens attend, on average."""
    tokens, pairs = tokens_and_pairs(segments)
    return pairs / tokens


@dataclass(frozen=True)
class PrefillCoefficients:
    """``t = step_s + per_token_s * n + per_pair_s * n * (2m + n) / 2`` for one step."""

    #: Fixed seconds per engine step.
    step_s: float
    #: Seconds per new token, independent of context.
    per_token_s: float
    #: Seconds per attended (query, key) pair.
    per_pair_s: float

    def __post_init__(self) -> None:
        for name in ("step_s", "per_token_s", "per_pair_s"):
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise ConfigError(f"policy: prefill {name}={value}; give a number >= 0")
        if self.per_token_s == 0 and self.per_pair_s == 0:
            raise ConfigError("policy: prefill per_token_s and per_pair_s are both 0; give one")

    def step_seconds(self, segments: Sequence[tuple[int, int]]) -> float:
        """Predicted seconds of one step computing ``(cached, new)`` segments."""
        tokens, pairs = tokens_and_pairs(segments)
        return self.step_s + self.per_token_s * tokens + self.per_pair_s * pairs


@dataclass(frozen=True)
class MeasuredStep:
    """One engine step the model learned from: ``(cached, new)`` per request, and its time."""

    #: ``(cached, new)`` tokens of each request computed in the step.
    segments: tuple[tuple[int, int], ...]
    #: Measured wall seconds of the step.
    seconds: float


#: Fast on purpose (see the module docstring): 200k tokens/s, no attention cost.
DEFAULT_PREFILL_PRIOR = PrefillCoefficients(step_s=0.0, per_token_s=5e-6, per_pair_s=0.0)


def _features(segments: Sequence[tuple[int, int]]) -> tuple[float, float, float]:
    tokens, pairs = tokens_and_pairs(segments)
    return (1.0, tokens / _TOKENS_UNIT, pairs / _PAIRS_UNIT)


def _rows(coef: PrefillCoefficients) -> list[tuple[Sequence[float], float]]:
    # A prior with step_s = 0 would give 0-second rows for no tokens; every point has n > 0.
    return [(_features([(m, n)]), coef.step_seconds([(m, n)])) for m, n in _PRIOR_POINTS]


class PrefillModel:
    """The engine's prefill cost, learned from its own steps. Not thread-safe (policy locks).

    ``max_step_tokens``: the engine's token budget per step (vLLM's
    ``max_num_batched_tokens``), so recomputing a hit is charged the extra steps of chunked
    prefill; None when unknown (then no step cost is charged to a recompute).
    """

    def __init__(
        self,
        prior: PrefillCoefficients = DEFAULT_PREFILL_PRIOR,
        *,
        prior_weight: float = 1e-6,
        half_life_steps: float = 32.0,
        min_step_tokens: int = 16,
        max_step_tokens: int | None = None,
    ) -> None:
        if min_step_tokens < 1:
            raise ConfigError(f"policy: min_step_tokens={min_step_tokens}; give 1 or more")
        if max_step_tokens is not None and max_step_tokens < 1:
            raise ConfigError(f"policy: max_step_tokens={max_step_tokens}; give 1 or more")
        self.prior = prior
        self.min_step_tokens = min_step_tokens
        self.max_step_tokens = max_step_tokens
        self._fit = DecayingLeastSquares(_rows(prior), prior_weight, half_life_steps)
        self._coef = prior
        # Solved lazily: steps arrive every few milliseconds, decisions far less often.
        self._stale = True
        self._recent: deque[MeasuredStep] = deque(maxlen=KEPT_STEPS)
        #: Longest context (cached + new tokens) of a calibration sample; 0 without one.
        self._calibrated_reach = 0
        #: Mean attended positions of the calibration samples (module docstring).
        self._calibrated_positions: tuple[float, ...] = ()
        #: The positions measured, (shortest, longest), while they span less than
        #: ``SPLIT_SPAN``; None when they span more or nothing was measured.
        self._narrow: tuple[float, float] | None = None
        #: Steps used since the model was made (replayed ones included); only grows.
        self.observed = 0

    def coefficients(self) -> PrefillCoefficients:
        """The current fit (the prior until steps or a calibration arrive)."""
        if self._stale:
            self._refresh()
        return self._coef

    @property
    def evidence(self) -> float:
        """Effective number of measured steps behind the fit (calibration excluded)."""
        return self._fit.data_weight

    @property
    def reach_tokens(self) -> int:
        """The longest context (cached + new tokens of one request) among the calibration and
        the recent steps: predictions for prompts up to this length interpolate what was
        measured, longer ones extrapolate the attention cost (0 before any measurement)."""
        ends = [m + n for step in self._recent for m, n in step.segments]
        return max([self._calibrated_reach, *ends])

    def step_seconds(self, segments: Sequence[tuple[int, int]]) -> float:
        """Predicted seconds of one step computing these ``(cached, new)`` segments."""
        return self.coefficients().step_seconds(segments)

    @property
    def split_known(self) -> bool:
        """False while the steps measured cannot tell the per-token cost from the attention
        cost (module docstring, "Steps all of one shape"); recomputes are then predicted low."""
        self.coefficients()
        return self._narrow is None

    def recompute_seconds(self, cached: int, new: int) -> float:
        """Predicted extra seconds to compute tokens ``[cached, cached + new)`` of a prompt.

        The per-step cost is not charged (the prompt's remaining tokens need a step anyway),
        except for the extra steps chunked prefill needs when ``max_step_tokens`` is set.
        """
        if new <= 0:
            return 0.0
        c = self.coefficients()
        position, scale = attended_pairs(cached, new) / new, 1.0
        if self._narrow is not None:
            shortest, longest = self._narrow
            if position > longest:  # no attention growth beyond what was measured
                position = longest
            elif position < shortest:  # all of the cost is attention
                position, scale = shortest, position / shortest
        return self._chunk_steps(c, new) + scale * new * (c.per_token_s + c.per_pair_s * position)

    def _chunk_steps(self, c: PrefillCoefficients, new: int) -> float:
        if self.max_step_tokens is None:
            return 0.0
        return c.step_s * (new // self.max_step_tokens)

    def most_seconds_per_token(self, max_tokens: int) -> float:
        """The most one token of a prompt of at most ``max_tokens`` tokens can add to a
        recompute: the last one's (attention grows with position), with its share of the extra
        steps chunked prefill takes. No hit in such a prompt costs more per token (nor while
        the split is unknown: ``recompute_seconds`` then predicts less than the fit)."""
        c = self.coefficients()
        seconds = c.per_token_s + c.per_pair_s * attended_pairs(max(max_tokens - 1, 0), 1)
        if self.max_step_tokens is not None:
            seconds += c.step_s / self.max_step_tokens
        return seconds

    def observe_step(self, segments: Sequence[tuple[int, int]], seconds: float) -> bool:
        """Feed the measured wall time of one engine step; True if it was used.

        ``segments``: ``(cached, new)`` per request in the step. Steps of fewer than
        ``min_step_tokens`` new tokens, and pure decode steps (every ``new`` is 1), are
        ignored: their cost is bound by reading the weights, not by the work modelled here.
        """
        segments = [(m, n) for m, n in segments if n > 0]
        tokens = sum(n for _, n in segments)
        if tokens < self.min_step_tokens or all(n == 1 for _, n in segments):
            return False
        if not (seconds > 0 and math.isfinite(seconds)):
            return False
        self._fit.observe(_features(segments), seconds)
        self._stale = True
        self._recent.append(MeasuredStep(tuple(segments), seconds))
        self.observed += 1
        return True

    def recent_steps(self) -> tuple[MeasuredStep, ...]:
        """The last ``KEPT_STEPS`` steps used, oldest first."""
        return tuple(self._recent)

    def calibrate(
        self, samples: Iterable[tuple[int, int, float]], weight: float | None = None
    ) -> PrefillCoefficients:
        """Replace the prior with measured ``(cached, new, seconds)`` samples of single prompts.

        ``weight``: how many steps the calibration is worth in all (default: one per sample).
        Returns the new coefficients. Measured steps still refine them afterwards.
        """
        used = [(m, n, s) for m, n, s in samples if n > 0 and s > 0]
        rows = [(_features([(m, n)]), s) for m, n, s in used]
        if not rows:
            raise ConfigError("policy: calibrate() needs (cached, new, seconds) with new, s > 0")
        self._fit.set_prior(rows, float(len(rows)) if weight is None else weight)
        self._calibrated_reach = max(m + n for m, n, _ in used)
        self._calibrated_positions = tuple(mean_attended_position([(m, n)]) for m, n, _ in used)
        self._stale = True
        return self.coefficients()

    def _refresh(self) -> None:
        step, per_k_tokens, per_m_pairs = self._fit.coefficients()
        per_token, per_pair = per_k_tokens / _TOKENS_UNIT, per_m_pairs / _PAIRS_UNIT
        if per_token == 0 and per_pair == 0:
            # Only possible when every measurement is explained by a fixed cost; keep the
            # previous per-token figures rather than predict free recompute.
            per_token, per_pair = self._coef.per_token_s, self._coef.per_pair_s
        self._coef = PrefillCoefficients(step, per_token, per_pair)
        positions = [mean_attended_position(measured.segments) for measured in self._recent]
        positions += self._calibrated_positions
        self._narrow = None
        if positions and max(positions) < SPLIT_SPAN * min(positions):
            self._narrow = (min(positions), max(positions))
        self._stale = False


def calibration_points(max_model_len: int) -> list[tuple[int, int]]:
    """A short calibration: ``(cached, new)`` prompt steps that pin all three coefficients.

    Four prompts, the longest ``max_model_len`` tokens at most: two cold prompts of different
    lengths (per-token cost) and a short suffix over a long cached prefix (attention cost).
    """
    if max_model_len < 64:
        raise ConfigError(f"policy: max_model_len={max_model_len}; calibration needs >= 64")
    long = max_model_len
    return [(0, long // 8), (0, long // 2), (long // 2, long // 4), (long - long // 8, long // 8)]
