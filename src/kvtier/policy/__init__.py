"""Restore or recompute: cost models, the decision and load deadlines (invariant 9).

Pure Python: imports neither vLLM nor torch (a test checks this in a fresh interpreter), and
every time source is an injectable clock. The adapters own the I/O and the engine hooks; this
package only predicts, decides and learns from what they measure.

    policy = RestorePolicy(PolicySettings(), PrefillModel(max_step_tokens=8192))
    policy.add_tier("host", RestorePrior(bandwidth_bytes_per_s=5e9, latency_s=0.001))
    policy.add_tier("disk")                                  # DEFAULT_RESTORE_PRIOR
    policy.observe_prefill([(0, 2048)], 0.41)                # after each prompt step
    d = policy.decide("disk", cached_tokens=0, hit_tokens=2048, hit_bytes=2048 * 131072)
    if d.restore:
        ticket = policy.begin_load("disk", 2048 * 131072)
        ...                             # past ticket.deadline_at_s: abandon_load(ticket)
        policy.end_load(ticket)

The reasoning (why all-or-nothing per tier) is in ``kvtier.policy.verdicts``; the facade
``RestorePolicy`` and its parts in ``kvtier.policy.restore_policy``; measured figures behind
the defaults in docs/gpu-evidence.md.
"""

from kvtier.policy.deadline import DeadlineRule
from kvtier.policy.evidence import AdoptedEvidence, PolicyEvidence
from kvtier.policy.load_tickets import LoadTicket
from kvtier.policy.prefill import (
    DEFAULT_PREFILL_PRIOR,
    MIN_PREFILL_EVIDENCE,
    MeasuredStep,
    PrefillCoefficients,
    PrefillModel,
    attended_pairs,
    calibration_points,
)
from kvtier.policy.restore import DEFAULT_RESTORE_PRIOR, MeasuredLoad, RestorePrior, TierSnapshot
from kvtier.policy.restore_policy import Clock, PolicySnapshot, RestorePolicy
from kvtier.policy.settings import PolicySettings
from kvtier.policy.verdicts import BatchHit, Decision, TierHit

__all__ = [
    "DEFAULT_PREFILL_PRIOR",
    "DEFAULT_RESTORE_PRIOR",
    "MIN_PREFILL_EVIDENCE",
    "AdoptedEvidence",
    "BatchHit",
    "Clock",
    "DeadlineRule",
    "Decision",
    "LoadTicket",
    "MeasuredLoad",
    "MeasuredStep",
    "PolicyEvidence",
    "PolicySettings",
    "PolicySnapshot",
    "PrefillCoefficients",
    "PrefillModel",
    "RestorePolicy",
    "RestorePrior",
    "TierHit",
    "TierSnapshot",
    "attended_pairs",
    "calibration_points",
]
