"""The restore decision's evidence kept in the disk tier's folder, one file per namespace.

A fresh engine has not timed a prefill yet, so its decision would restore every hit unweighed;
yet a restart is exactly when the disk tier is read. Whatever the disk holds was stored by an
earlier process of the same namespace, which timed its prefill and its loads meanwhile. So one
tier of the engine (the first disk tier: ``StoreTier`` claims the spec's ``evidence_keeper``)
keeps the policy's evidence beside its records, ``<disk_dir>/<namespace>/decision.json``
(format: ``kvtier.policy.evidence_file``):

* **At open** (the tier's opener thread, before any lookup can see the store), the file is read
  and, if it is this namespace's, of this format version and measured on this device
  (``Release.device_description``), replayed into the policy (``RestorePolicy.adopt``): the
  decision weighs the first request's hits. A missing file starts unmeasured; a damaged,
  foreign or old one is ignored with one warning and counted (metric
  ``kvtier:decision_evidence_files{outcome="ignored"}``); nothing here ever fails the engine.
* **While serving**, the opener thread's housekeeping (every second, off the scheduler thread)
  saves the evidence when ``SAVE_EVERY_MEASUREMENTS`` new measurements arrived, or any arrived
  ``SAVE_INTERVAL_S`` ago; **at shutdown** once more. A save that fails (disk full, folder
  removed) is one warning, counted (``outcome="write_failed"``), and retried at the next round.
  Several engines on one folder each replace the file; the last save wins, which is as good:
  they measured the same device.
* The engine's start-up line says where the decision's evidence comes from (``startup_text``).

Rejected: keeping the fit's sums (they cannot be trimmed or checked when read back, and a new
prior or feature scale would silently misread them); a calibration run at start-up (minutes of
engine time on a long context, and the server is not ready meanwhile).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from kvtier.errors import KvtierError
from kvtier.policy import MIN_PREFILL_EVIDENCE, AdoptedEvidence, RestorePolicy
from kvtier.policy.evidence_file import EvidenceFile, EvidenceRejected, load, save

logger = logging.getLogger(__name__)

#: New measurements after which the evidence is saved at the next housekeeping round.
SAVE_EVERY_MEASUREMENTS = 8
#: Seconds after which any new measurement is saved.
SAVE_INTERVAL_S = 30.0

#: The start-up line's words when there is nothing to start from.
UNMEASURED = "decision: unmeasured until the engine's first prefills"


class DecisionMemory:
    """One engine's decision evidence in one namespace folder (see the module docstring).

    ``load`` once, on the thread that opens the store; ``maybe_save`` from the housekeeping
    thread; ``save`` at shutdown. Thread-safe (one lock around saves).
    """

    def __init__(
        self,
        policy: RestorePolicy,
        path: Path,
        namespace_hex: str,
        device: str | None,
        *,
        label: str = "disk tier",
        wall_clock: Callable[[], float] = time.time,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self.path = path
        self.namespace_hex = namespace_hex
        self.device = device
        self._label = label
        self._wall_clock = wall_clock
        self._clock = clock
        self._lock = threading.Lock()
        self._saved_measurements = 0
        self._saved_at = clock()
        self._warned_write = False
        #: Files adopted, ignored, and saves that failed (cumulative, for metrics).
        self.loaded = 0
        self.ignored = 0
        self.write_failed = 0
        #: What the start-up line says (set by ``load``).
        self.startup_text = UNMEASURED

    def load(self) -> AdoptedEvidence | None:
        """Adopt the folder's evidence if it applies; None if there was none to adopt.
        Never raises: a hint must not fail the engine."""
        adopted: AdoptedEvidence | None = None
        if self.device is None:
            self.startup_text = f"{UNMEASURED} (this device cannot be described: none kept)"
            return None
        try:
            record = load(self.path, self.namespace_hex, self.device)
            if record is not None:
                adopted = self.policy.adopt(record.evidence)
                self.loaded += 1
                self.startup_text = describe(adopted, record, self.policy.prefill.evidence)
        except Exception as exc:
            reason = exc.reason if isinstance(exc, EvidenceRejected) else str(exc)
            self.ignored += 1
            self.startup_text = f"{UNMEASURED} (evidence file ignored: {reason})"
            logger.warning(
                "kvtier %s: decision evidence %s ignored (%s); the restore decision is "
                "unmeasured until the engine's first prefills",
                self._label,
                self.path,
                reason,
            )
        # What was adopted is on disk already: only later measurements are news.
        self._saved_measurements = self.policy.evidence().measurements
        return adopted

    def maybe_save(self) -> None:
        """Save if enough is new (``SAVE_EVERY_MEASUREMENTS``) or anything is new and the last
        save is ``SAVE_INTERVAL_S`` old. For the housekeeping thread."""
        evidence = self.policy.evidence()
        new = evidence.measurements - self._saved_measurements
        if new <= 0:
            return
        if new < SAVE_EVERY_MEASUREMENTS and self._clock() - self._saved_at < SAVE_INTERVAL_S:
            return
        self.save()

    def save(self) -> bool:
        """Write the evidence now if anything is new since the last save; True if written
        (or nothing was new). Never raises."""
        if self.device is None:
            return True
        with self._lock:
            evidence = self.policy.evidence()
            if evidence.measurements <= self._saved_measurements:
                return True
            record = EvidenceFile(self.namespace_hex, self.device, self._wall_clock(), evidence)
            try:
                save(self.path, record)
            except (OSError, KvtierError) as exc:
                self.write_failed += 1
                self._saved_at = self._clock()  # retried after the interval, not every second
                if not self._warned_write:
                    self._warned_write = True
                    logger.warning(
                        "kvtier %s: cannot save the decision evidence to %s (%s); a restart "
                        "will start unmeasured (retried; warned once)",
                        self._label,
                        self.path,
                        exc,
                    )
                return False
            self._saved_measurements = evidence.measurements
            self._saved_at = self._clock()
            return True


def describe(adopted: AdoptedEvidence, record: EvidenceFile, prefill_evidence: float) -> str:
    """The start-up line's words for adopted evidence."""
    origin = f"measured by an earlier process ({record.saved_on}, {record.device})"
    loads = ", ".join(f"{tier} {n} loads" for tier, n in sorted(adopted.tier_loads.items()))
    steps = f"{adopted.prefill_steps} prefill step{'s' if adopted.prefill_steps != 1 else ''}"
    if prefill_evidence < MIN_PREFILL_EVIDENCE:
        known = f"; {loads}" if loads else ""
        return f"{UNMEASURED} (only {steps}{known} {origin})"
    return f"decision: {steps}{' and ' + loads if loads else ''} {origin}"
