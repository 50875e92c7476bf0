"""What kvtier's spec shares with kvtier's tiers in one engine, and the start path both of
kvtier's specs take.

An engine's kvtier tiers share one restore-or-recompute policy, one start-up line, the
scheduler's step clock, the master keys the spec read (no tier reads its key files again),
and two roles that exactly one tier may hold: the tier that feeds the engine's prefill
measurements to the policy, and the tier that keeps the policy's evidence in its folder.
``EngineContext`` holds them; a tier reaches it through ``engine_context(spec)``, one typed
accessor, and claims a role by a method that says whether it got it.

Two modes, chosen by the spec vLLM was given:

* kvtier's spec (``KvtierCpuSpec``, ``KvtierCudaSpec``, both ``KvtierSpec``): the spec builds
  the context once, and every tier of the engine receives it;
* a stock spec (vLLM's own, with a kvtier tier named in ``secondary_tiers`` by hand): no spec
  shares anything, so each tier gets a context of its own (``EngineContext.stock``): its own
  policy, no step clock, no start-up line (its part is logged alone), both roles its own,
  and its key files read by the tier itself, once.

``start_options`` is the start path of both specs: every kvtier option of the spec and of its
tiers is parsed and checked here, on every platform, before any pool exists; an option that
cannot apply on the platform refuses start-up naming it and the fix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.errors import ConfigError
from kvtier.format.keyfiles import TierKeyRings
from kvtier.policy import RestorePolicy
from kvtier.runtime.engine_policy import make_policy
from kvtier.runtime.guards import check_cpu_data_plane_options, check_tiering_options
from kvtier.runtime.startup_line import StartupLine
from kvtier.runtime.step_clock import StepClock
from kvtier.settings import (
    DiskTierSettings,
    HostPoolSettings,
    SharedTierSettings,
    parse_tier,
)
from kvtier.store import check_root
from kvtier.vllm.release import Release, current

logger = logging.getLogger("kvtier.vllm.spec")

Platform = Literal["cpu", "cuda"]
TierSettings = DiskTierSettings | SharedTierSettings | None


class EngineContext:
    """One engine's shared kvtier state (scheduler process; built by the spec, read by its
    tiers from their constructors and their opener threads)."""

    def __init__(
        self,
        release: Release,
        policy: RestorePolicy,
        step_clock: StepClock | None = None,
        keyrings: TierKeyRings | None = None,
    ) -> None:
        self.release = release
        self.policy = policy
        #: When the engine computed a stored block (None: evidence timed to the store jobs).
        self.step_clock = step_clock
        #: The master keys of the engine's encrypted tiers: those the spec read while checking
        #: its options (``start_options``), each tier taking its own from here instead of
        #: reading the files again; empty for a stock context (its tier reads its own once).
        self.keyrings = keyrings if keyrings is not None else TierKeyRings()
        #: The engine's one start-up line, begun by the spec once its host pool is known.
        self.startup_line: StartupLine | None = None
        self._prefill_observer: str | None = None
        self._evidence_keeper: str | None = None

    @classmethod
    def stock(cls, clock: Callable[[], float], release: Release | None = None) -> EngineContext:
        """A tier's own context under a spec that shares none (vLLM's own spec)."""
        return cls(current() if release is None else release, make_policy(True, clock))

    @property
    def prefill_observer(self) -> str | None:
        """The tier that feeds the prefill measurements (None: none yet)."""
        return self._prefill_observer

    @property
    def evidence_keeper(self) -> str | None:
        """The tier that keeps the evidence in its folder (None: none)."""
        return self._evidence_keeper

    def claim_prefill_observer(self, tier: str) -> bool:
        """Whether ``tier`` feeds the engine's prefill measurements to the policy: the first
        tier to ask does, no other (one fit per engine)."""
        if self._prefill_observer is not None:
            return False
        self._prefill_observer = tier
        return True

    def claim_evidence_keeper(self, tier: str) -> bool:
        """Whether ``tier`` keeps the policy's evidence in its folder (the first tier that can
        and asks does: one file per engine, not per tier)."""
        if self._evidence_keeper is not None:
            return False
        self._evidence_keeper = tier
        return True

    def report(self, part: str) -> None:
        """A tier's part of the start-up line (logged alone where there is no line)."""
        if self.startup_line is not None:
            self.startup_line.report(part)
        else:
            logger.info("kvtier: tier: %s", part)

    def report_decision(self, text: str) -> None:
        """Where the decision's evidence comes from (before the keeper tier's ``report``)."""
        if self.startup_line is not None:
            self.startup_line.set_decision(text)
        else:
            logger.info("kvtier: %s", text)


class KvtierSpec(TieringOffloadingSpec):
    """vLLM's tiering spec as kvtier's specs extend it: each holds its engine's context."""

    #: The engine's shared kvtier state (set by the spec's ``__init__``).
    kvtier: EngineContext


def engine_context(spec: object, clock: Callable[[], float]) -> EngineContext:
    """The context a tier built by ``spec`` works in: kvtier's spec's, or, under a stock spec,
    a context of the tier's own (``clock``: its policy's)."""
    if isinstance(spec, KvtierSpec):
        return spec.kvtier
    return EngineContext.stock(clock)


@dataclass(frozen=True)
class StartOptions:
    """The spec's and its tiers' options, parsed and checked (``start_options``)."""

    host_pool: HostPoolSettings
    #: One entry per ``secondary_tiers`` entry: kvtier's settings, None for another tier.
    tiers: tuple[TierSettings, ...]
    #: The encrypted tiers' master keys, read once here; the spec hands them to its tiers
    #: through its ``EngineContext``.
    keyrings: TierKeyRings


#: Spec options that only kvtier's CPU spec honours, with the fix on ``platform='cuda'``
#: (where vLLM's own spec runs the host pool): (field, its default, the option's names).
CPU_SPEC_ONLY: tuple[tuple[str, Any, str], ...] = (
    ("host_pool_dir", None, "host_pool_dir / --host-pool-dir"),
    ("allow_small_tiers", False, "allow_small_tiers / --allow-small-tiers"),
    ("restore_decision", True, "restore_decision / --no-restore-decision"),
)


def start_options(extra: Mapping[str, Any], platform: Platform) -> StartOptions:
    """Parse and check every kvtier option in ``kv_connector_extra_config``; refuse what is
    unknown, invalid, or cannot apply on ``platform``; check each disk folder and key file.
    The first thing both specs do after setting up logging (``kvtier.log.setup_logging``,
    which refuses a bad KVTIER_* variable): a refusal stops the engine before any pool exists."""
    host_pool = HostPoolSettings.from_extra_config(extra)
    check_tiering_options(extra)
    if platform == "cpu":
        check_cpu_data_plane_options(extra)
    else:
        for field, default, option in CPU_SPEC_ONLY:
            value = getattr(host_pool, field)
            if value != default:
                raise ConfigError(
                    f"kvtier: {option}={value!r} needs kvtier's CPU spec; on platform='cuda' "
                    f"vLLM's own spec runs the host pool: remove {field} from "
                    "kv_connector_extra_config['kvtier'] (or from kvtier.kv_transfer_config)"
                )
    tiers = tuple(parse_tier(tier) for tier in tier_entries(extra))
    keyrings = TierKeyRings()
    for tier in tiers:
        if isinstance(tier, DiskTierSettings):
            check_root(tier.root_dir)
        keyrings.for_tier(tier)  # a key file that cannot be used refuses the start here
    return StartOptions(host_pool, tiers, keyrings)


def tier_entries(extra: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return extra.get("secondary_tiers") or []
