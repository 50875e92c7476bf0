"""``KvtierCudaSpec``: vLLM's own tiering spec on a CUDA build, with kvtier's tiers in it.

Loaded by vLLM through ``kv_connector_extra_config`` (``kvtier.kv_transfer_config(...,
platform="cuda")``)::

    {"spec_name": "KvtierCudaSpec", "spec_module_path": "kvtier.vllm.cuda_spec",
     "cpu_bytes_to_use": ..., "secondary_tiers": [{"type": "KvtierDiskTier", ...}]}

vLLM's ``TieringOffloadingSpec`` runs the host pool (its GPU worker copies with DMA streams),
unchanged: nothing of kvtier's CPU data plane runs here. kvtier adds:

* its tiers by name where vLLM's tier factory cannot load a tier by ``module_path``
  (``Release.register_tiers``): importing this module registers them, and vLLM imports it in
  every process that resolves the spec, including the one that builds the metrics;
* the start-up checks: every kvtier option parsed and checked as on the CPU
  (``kvtier.vllm.engine_context.start_options``; an option only kvtier's CPU spec honours
  refuses start-up naming it), each tier's folder checked before any pool exists, and block
  hashes that are the same in every process and after a restart (``PYTHONHASHSEED``; where
  ``NONE_HASH`` is random for every algorithm without it, ``Release.stable_hash_algos``, the
  engine refuses to start instead of storing blocks no one can find);
* its engine's ``EngineContext``: one restore-or-recompute policy shared by its tiers, and the
  start-up line, which says how the decision measures the engine's prefill on this vLLM
  (``tier_decider.prefill_evidence``) and
  where its evidence comes from (an earlier process's, kept with the disk tier:
  ``kvtier.runtime.decision_memory``);
* the scheduler's step times, so that the prefill evidence ends where the engine computed a
  stored block, not where its store job reached kvtier's tier, steps later
  (``kvtier.runtime.step_clock``): vLLM's manager is returned wrapped
  (``kvtier.runtime.step_timed_manager``), every call going to it unchanged.
"""

import logging
import os
import time
from collections.abc import Callable
from typing import Any

from vllm.v1.kv_offload.base import OffloadingManager

from kvtier.log import setup_logging
from kvtier.runtime.decision_memory import UNMEASURED
from kvtier.runtime.engine_policy import CUDA_HOST_COPY_PRIOR_BYTES_PER_S, HOST_TIER, make_policy
from kvtier.runtime.guards import check_hash_stability, persistent_tiers
from kvtier.runtime.startup_line import StartupLine
from kvtier.runtime.step_clock import StepClock
from kvtier.runtime.step_timed_manager import StepTimedManager
from kvtier.units import format_size
from kvtier.vllm.engine_context import EngineContext, KvtierSpec, start_options
from kvtier.vllm.release import current
from kvtier.vllm.store_tier import StoreTier
from kvtier.vllm.tier_decider import prefill_evidence

logger = logging.getLogger(__name__)

current().register_tiers()


class KvtierCudaSpec(KvtierSpec):
    """vLLM's tiering spec, its host pool untouched, checked for kvtier's persistent tiers."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        setup_logging()  # first: a bad KVTIER_* variable refuses start-up (kvtier.env)
        # 0.32: (config); 0.25.1: (vllm_config, kv_cache_config). Passed through unchanged.
        super().__init__(*args, **kwargs)
        release = current()
        options = start_options(self.extra_config, "cuda")
        self.tier_settings = list(options.tiers)
        vllm_config = release.engine_vllm_config(self)
        #: When the engine computed a stored block (None where vLLM's config does not say how
        #: many steps it keeps in flight: the evidence is then timed to the store jobs).
        step_clock: StepClock | None = None
        depth = release.steps_in_flight(vllm_config)
        if depth is not None:
            step_clock = StepClock(time.monotonic, depth)
        self._timed_manager: StepTimedManager | None = None
        if vllm_config is not None:
            check_hash_stability(
                str(vllm_config.cache_config.prefix_caching_hash_algo),
                os.environ.get("PYTHONHASHSEED"),
                persistent_tiers(self.secondary_tier_configs),
                release.stable_hash_algos,
            )
        #: The engine's shared kvtier state: the restore-or-recompute policy kvtier's tiers
        #: register with, the step clock and the start-up line.
        self.kvtier = EngineContext(
            release,
            make_policy(
                True,
                time.monotonic,
                CUDA_HOST_COPY_PRIOR_BYTES_PER_S,
                prefill_timed_to_steps=step_clock is not None,
            ),
            step_clock,
            keyrings=options.keyrings,
        )

    def get_manager(self) -> OffloadingManager:
        if self.kvtier.release.spec_manager(self) is None:
            self._start_line()
        manager = super().get_manager()
        step_clock = self.kvtier.step_clock
        if step_clock is None:
            return manager
        if self._timed_manager is None:
            self._timed_manager = StepTimedManager(
                manager,
                step_clock,
                self._host_load_observer(manager),
                schedule_end_last=self.kvtier.release.schedule_end_last,
            )
        return self._timed_manager  # type: ignore[return-value]  # delegates every call

    def _host_load_observer(self, manager: Any) -> Callable[[int, float], None] | None:
        """What feeds the host pool's timed loads to the GPU to the policy, in the bytes its
        predictions use (a kvtier tier's row: ``keys x row bytes``); None without a kvtier
        tier, whose restores are the only ones weighed."""
        row_bytes = next(
            (
                tier.decider.row_bytes
                for tier in self.kvtier.release.secondary_tiers(manager)
                if isinstance(tier, StoreTier)
            ),
            0,
        )
        if not row_bytes:
            return None
        policy = self.kvtier.policy

        def observe(keys: int, seconds: float) -> None:
            policy.observe_load(HOST_TIER, keys * row_bytes, seconds)

        return observe

    def _evidence_end(self) -> str:
        step_clock = self.kvtier.step_clock
        if step_clock is None:
            return "each timed to its store job's arrival"
        return (
            "each timed to the end of the step that computed it, "
            f"{step_clock.depth} step(s) in flight"
        )

    def _start_line(self) -> None:
        pool_bytes = int(self.extra_config.get("cpu_bytes_to_use") or 0)
        head = (
            f"vLLM host pool {format_size(pool_bytes)} = "
            f"{self.kvtier.release.host_pool_rows(self):,} rows "
            f"(vLLM's own spec, {self.kvtier.release.name})"
        )
        others = [
            str(t.get("type"))
            for t, parsed in zip(self.secondary_tier_configs, self.tier_settings, strict=True)
            if parsed is None
        ]
        if others:
            head += f"; other tiers: {', '.join(others)}"
        evidence = prefill_evidence(self.kvtier.release)
        head += f"; restore decision on ({evidence}; {self._evidence_end()})"
        kvtier_tiers = sum(1 for t in self.tier_settings if t is not None)
        self.kvtier.startup_line = StartupLine(head, kvtier_tiers, UNMEASURED)
