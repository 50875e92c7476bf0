"""One INFO line per engine naming every tier once all of them are known.

The host pool's size is known when the scheduler builds its manager; a kvtier tier's folder,
cap and namespace only once its store is open (after vLLM seeds its block hashes). The spec
starts a ``StartupLine`` with the pool's part and the number of kvtier tiers; each tier
reports its part (or that it failed); the line is logged when the last part arrives. With the
restore decision on, the line ends with where the decision's evidence comes from: unmeasured,
unless the tier that keeps the evidence (``kvtier.runtime.decision_memory``) says otherwise
before it reports.
"""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("kvtier.vllm.spec")


class StartupLine:
    """Collects one part per tier and logs them as a single line."""

    def __init__(self, head: str, expected_tiers: int, decision: str | None = None) -> None:
        """``decision``: the decision's part until a tier replaces it (None: the decision
        is off, the line has no such part)."""
        self._parts = [head]
        self._decision = decision
        self._missing = expected_tiers
        self._lock = threading.Lock()
        if expected_tiers == 0:
            self._log()

    def set_decision(self, text: str) -> None:
        """Where the decision's evidence comes from (a tier, before its own ``report``)."""
        with self._lock:
            if self._decision is not None:
                self._decision = text

    def report(self, part: str) -> None:
        """A tier's description; the line is logged once every tier has reported."""
        with self._lock:
            self._parts.append(part)
            self._missing -= 1
            done = self._missing == 0
        if done:
            self._log()

    def _log(self) -> None:
        parts = self._parts if self._decision is None else [*self._parts, self._decision]
        logger.info("kvtier: tiers: %s", "; ".join(parts))

    @property
    def text(self) -> str:
        """The line as it stands (for tests)."""
        with self._lock:
            parts = self._parts if self._decision is None else [*self._parts, self._decision]
            return "; ".join(parts)
