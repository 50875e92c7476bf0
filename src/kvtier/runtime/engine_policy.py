"""An engine's restore-or-recompute policy as kvtier's tiers share it: the host pool's copy to
the engine registered as the first tier every restore pays after its own load, with a prior for
it that nothing measures on the CPU. Knows nothing of vLLM: the specs build it
(``kvtier.vllm.engine_context``), and each kvtier tier adds itself ``via`` the host pool.
"""

from __future__ import annotations

from collections.abc import Callable

from kvtier.policy import PolicySettings, RestorePolicy, RestorePrior

#: The host pool's copy to the engine, which every tier's restore also pays. kvtier cannot
#: time it from the scheduler (the copy runs in the worker processes); the CPU backend's
#: copy runs faster than this (docs/benchmarks.md, "Restore bandwidth next to the physical
#: limits"), so this prior is on the slow side.
HOST_COPY_PRIOR_BYTES_PER_S = 4e9
#: The same copy on CUDA, where vLLM's own CPU pool copies from pinned memory over PCIe (or
#: NVLink-C2C): PCIe Gen3 x16's ~12 GB/s is the slowest host link a data-center GPU has, so
#: this too errs slow. A host of a faster link copies several times faster; kvtier's CUDA
#: spec times the copy itself (``kvtier.runtime.step_timed_manager``), so the prior only
#: weighs until the first restores.
CUDA_HOST_COPY_PRIOR_BYTES_PER_S = 12e9


#: The policy's name for the host pool's copy to the engine, which every tier's restore
#: pays after its own load (the tiers are added ``via`` it).
HOST_TIER = "host"


def make_policy(
    enabled: bool,
    clock: Callable[[], float],
    host_copy_bytes_per_s: float = HOST_COPY_PRIOR_BYTES_PER_S,
    prefill_timed_to_steps: bool = False,
) -> RestorePolicy:
    """An engine's policy with the host pool registered (tiers add themselves ``via`` it);
    ``host_copy_bytes_per_s``: the prior of the host pool's copy to the engine, which nothing
    measures (``CUDA_HOST_COPY_PRIOR_BYTES_PER_S`` on CUDA). ``prefill_timed_to_steps``: the
    prefill evidence ends at the step that computed each block (a ``StepClock``); only then
    may a restore within the evidence win by the narrower margin
    (``PolicySettings.safety_factor_within_evidence``). Timed to its store job's arrival, the
    evidence reads prefill slow by the steps the job trails them (``kvtier.runtime.step_clock``),
    more than that margin."""
    settings = PolicySettings(enabled=enabled)
    if not prefill_timed_to_steps:
        settings = settings.model_copy(
            update={"safety_factor_within_evidence": settings.safety_factor}
        )
    policy = RestorePolicy(settings, clock=clock)
    policy.add_tier(HOST_TIER, RestorePrior(host_copy_bytes_per_s, 0.0005))
    return policy
