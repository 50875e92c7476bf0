"""The measurements behind the decision's models, taken out of one policy and replayed into
another (an earlier process's, kept beside the disk tier's records).

``gather`` gives the last prefill steps and each tier's last loads; ``replay`` enters such a
record into a fresh policy's models, oldest first, as if measured now: the prefill steps then
count as evidence and new measurements outweigh them within a few half-lives. Whether a
record applies (same engine, same hardware) is the caller's to judge
(``kvtier.policy.evidence_file``); slow marks are never carried over: a replayed load counts
towards the fit and the throughput shown, not a deadline.

Not thread-safe on its own: ``RestorePolicy`` calls it under its lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvtier.policy.prefill import MeasuredStep, PrefillModel
from kvtier.policy.restore import MeasuredLoad
from kvtier.policy.tier_chain import TierChain


@dataclass(frozen=True)
class PolicyEvidence:
    """The measurements behind a policy's models, oldest first (``evidence`` / ``adopt``)."""

    #: The prefill model's last measured steps.
    prefill_steps: tuple[MeasuredStep, ...]
    #: Each measured tier's last loads, by tier name (tiers never measured are left out).
    tier_loads: dict[str, tuple[MeasuredLoad, ...]]
    #: Measurements entered since the policy was made (adopted ones too); only grows, so a
    #: keeper can tell whether anything is new since it last saved.
    measurements: int = 0


@dataclass(frozen=True)
class AdoptedEvidence:
    """What ``adopt`` replayed."""

    #: Prefill steps used (a step the model ignores, e.g. decode-sized, is not counted).
    prefill_steps: int
    #: Loads replayed per tier; tiers this policy does not have are left out.
    tier_loads: dict[str, int]


def gather(prefill: PrefillModel, chain: TierChain) -> PolicyEvidence:
    """The measurements behind ``prefill`` and ``chain`` now (a copy: a few dozen tuples)."""
    estimates = list(chain.estimates())
    loads = {name: est.recent_loads() for name, est in estimates if est.measured}
    return PolicyEvidence(
        prefill_steps=prefill.recent_steps(),
        tier_loads={name: measured for name, measured in loads.items() if measured},
        measurements=prefill.observed + sum(est.measured for _, est in estimates),
    )


def replay(evidence: PolicyEvidence, prefill: PrefillModel, chain: TierChain) -> AdoptedEvidence:
    """Enter ``evidence`` into ``prefill`` and ``chain``, oldest first; loads of a tier the
    chain does not have are skipped."""
    steps = sum(
        prefill.observe_step(step.segments, step.seconds) for step in evidence.prefill_steps
    )
    loads: dict[str, int] = {}
    for name, measured in evidence.tier_loads.items():
        est = chain.get(name)
        if est is None or not measured:
            continue
        for load in measured:
            est.record(load.nbytes, load.seconds)
        loads[name] = len(measured)
    return AdoptedEvidence(steps, loads)
