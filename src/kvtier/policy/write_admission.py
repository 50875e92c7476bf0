"""Whether a tier's store jobs are worth writing: not while no restore from it could pay.

A tier slower than the engine's own prefill at every prompt length the engine takes (a disk
that reads 1 GB/s beside an engine that prefills 5 GB/s of KV) gets every hit refused by the
decision (``kvtier.policy.verdicts``). Its writes still cost the engine: the write threads
share its process and its host memory (docs/benchmarks.md, "No reuse"). So, with the decision
on, a store is skipped while:

* the engine's prefill and the tier's loads are both measured (before that nothing is
  skipped: a tier is assumed slow until measured, and writes are what it is measured on);
* no hit could pay in any prompt of up to ``max_tokens`` tokens, on the tier's measured speed
  without its slow mark, under the most lenient factor a verdict uses, with the engine idle
  (``RestorePolicy.restore_never_pays``): a comparison that does not depend on whether the
  tier is writing, so skipping cannot flip it back;
* and no verdict restored from the tier within ``RESTORE_MEMORY_S``. With requests queued on
  the engine a restore beside the queue can pay where one alone cannot
  (``verdicts.decide_batch``); a workload that gets such verdicts keeps its writes.

While skipping, one store job in each ``probe_interval_s`` (the policy's probe period) is
still written: the tier keeps records to be measured on and looked up, so a restore verdict
under load, or a faster disk, can end the skipping. Nothing here changes what is served: a
skipped block is a miss that the engine recomputes, as the decision would have had it. The
tier asks only for stores that this host alone reads (``kvtier.vllm.store_tier``): records on
a server serve other machines, whose prefill this policy does not know.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from kvtier.policy.restore_policy import RestorePolicy

logger = logging.getLogger(__name__)

#: How long a restore verdict keeps the tier's writes on: the bursts that make restores pay
#: beside a queued engine come and go within seconds to a minute of serving.
RESTORE_MEMORY_S = 60.0


class WriteAdmission:
    """One tier's store admission (the scheduler thread, as the tier's lookups and store
    jobs; a few microseconds of arithmetic a call)."""

    def __init__(
        self,
        policy: RestorePolicy,
        tier: str,
        max_tokens: int | None,
        block_tokens: int,
        block_bytes: int,
        clock: Callable[[], float],
    ) -> None:
        """``max_tokens``: the longest prompt the engine takes (None: unknown, every store is
        written); ``block_tokens``, ``block_bytes``: one record's tokens and bytes."""
        self._policy = policy
        self._tier = tier
        self._max_tokens = max_tokens
        self._block_tokens = block_tokens
        self._block_bytes = block_bytes
        self._clock = clock
        self._last_restore = float("-inf")
        self._last_sample = float("-inf")
        #: Whether the last store job was skipped (or sampled while skipping): for the log.
        self.skipping = False

    def note_restore(self) -> None:
        """A verdict restored a hit from this tier."""
        self._last_restore = self._clock()

    def admit(self) -> bool:
        """Whether to write the store job at hand (False: skip it, nothing written)."""
        now = self._clock()
        if (
            self._max_tokens is None
            or now - self._last_restore < RESTORE_MEMORY_S
            or not self._policy.restore_never_pays(
                self._tier, self._max_tokens, self._block_tokens, self._block_bytes
            )
        ):
            self._note(False)
            return True
        sample = now - self._last_sample >= self._policy.settings.probe_interval_s
        if sample:
            self._last_sample = now
        self._note(True)
        return sample

    def _note(self, skipping: bool) -> None:
        """Log each change between writing and skipping (not each job)."""
        if skipping == self.skipping:
            return
        self.skipping = skipping
        if skipping:
            logger.info(
                "kvtier: %s: skipping stores: no restore from it can beat the engine's prefill "
                "at prompts of up to %d tokens (one store job written every %.0f s to keep "
                "measuring it)",
                self._tier,
                self._max_tokens,
                self._policy.settings.probe_interval_s,
            )
        else:
            logger.info("kvtier: %s: writing every store again", self._tier)
