"""``KvtierCpuSpec`` start-up: guards run before any pool exists, and both roles agree on it.

The worker and scheduler specs are built here in one process, the way vLLM's uniprocess
executor builds them, from a hand-made ``OffloadingConfig`` (no engine).
"""

import logging
import os
import time
import uuid

import pytest
import torch
from vllm.v1.kv_offload.base import CanonicalKVCacheRef, CanonicalKVCaches, CanonicalKVCacheTensor
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

import kvtier.vllm.host_pool as host_pool_module
from kvtier.errors import ConfigError
from kvtier.hostpool.ram_guard import MemorySnapshot
from kvtier.hostpool.regions import region_path
from kvtier.vllm.spec import KvtierCpuSpec
from tests.support.key_files import key_file, key_file_reads

PAGE = 64 * 1024  # bytes of one engine block (one layer here)
MiB = 2**20


def offloading_config(engine_id: str, pool_bytes: int, **extra) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=128, layer_names=("l.0",), group_id=0),),
        worker_kv_bytes_per_block=PAGE,
        enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": pool_bytes, "secondary_tiers": [], **extra},
        engine_id=engine_id,
        model=OffloadingModelConfig(name="test-model", dtype="float32"),
        cache=OffloadingCacheConfig(tokens_per_hash=128, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )


def engine_kv(num_blocks: int) -> CanonicalKVCaches:
    tensor = torch.zeros(num_blocks, PAGE, dtype=torch.int8)
    return CanonicalKVCaches(
        [CanonicalKVCacheTensor(tensor, PAGE)], [[CanonicalKVCacheRef(0, PAGE)]]
    )


@pytest.fixture
def engine_id():
    engine_id = f"kvtier-unit-{uuid.uuid4().hex}"
    yield engine_id
    region_path(engine_id).unlink(missing_ok=True)


@pytest.fixture
def kvtier_logs(monkeypatch, caplog):
    monkeypatch.setattr(logging.getLogger("kvtier"), "propagate", True)
    caplog.set_level(logging.INFO, logger="kvtier")
    return caplog


def startup_line(kvtier_logs, timeout_s: float = 30.0) -> str:
    """The engine's one start-up line, once the store has opened and logged it."""
    deadline = time.monotonic() + timeout_s
    while True:
        lines = [r.message for r in kvtier_logs.records if r.message.startswith("kvtier: tiers:")]
        if lines:
            (line,) = lines
            return line
        assert time.monotonic() < deadline, "no start-up line"
        time.sleep(0.05)


def test_unsupported_connector_option_is_refused_before_anything_is_built():
    with pytest.raises(ConfigError, match="store_threshold=3 is not supported"):
        KvtierCpuSpec(offloading_config("x", 64 * MiB, store_threshold=3))


def test_host_pool_no_larger_than_the_engine_pool_is_refused_and_no_pool_is_created(engine_id):
    spec = KvtierCpuSpec(offloading_config(engine_id, 8 * MiB))  # 128 rows
    with pytest.raises(
        ConfigError,
        match=r"tier sizing trap: host pool: host_pool=8.00 MiB holds "
        r"16,384 tokens \(128 x 64.00 KiB\), no more than the engine KV pool "
        r"\(32,768 tokens",
    ):
        spec.get_worker(engine_kv(256))
    assert not region_path(engine_id).exists()


def test_small_host_pool_starts_with_a_warning_when_allowed(engine_id, kvtier_logs):
    spec = KvtierCpuSpec(offloading_config(engine_id, 8 * MiB, kvtier={"allow_small_tiers": True}))
    worker = spec.get_worker(engine_kv(256))
    try:
        assert any("would never serve a restore" in r.message for r in kvtier_logs.records)
    finally:
        worker.shutdown()


def test_host_pool_larger_than_the_engine_pool_starts_and_logs_the_sizing(engine_id, kvtier_logs):
    spec = KvtierCpuSpec(offloading_config(engine_id, 32 * MiB))
    worker = spec.get_worker(engine_kv(256))
    try:
        (line,) = [r.message for r in kvtier_logs.records if r.message.startswith("kvtier sizing")]
        assert "engine KV pool 16.00 MiB = 256 x 64.00 KiB = 32,768 tokens" in line
        assert "host pool 32.00 MiB = 512 x 64.00 KiB = 65,536 tokens" in line
    finally:
        worker.shutdown()


def test_clamped_pool_is_adopted_by_the_scheduler_from_the_file_size(
    engine_id, monkeypatch, kvtier_logs
):
    # 40 MiB spare after the floor: a 64 MiB pool is clamped to 40 MiB (640 rows)
    snapshot = MemorySnapshot(total_bytes=2**30, available_bytes=(256 + 40) * MiB)
    monkeypatch.setattr(host_pool_module, "read_memory", lambda: snapshot)
    config = offloading_config(engine_id, 64 * MiB)
    worker_spec = KvtierCpuSpec(config)
    worker = worker_spec.get_worker(engine_kv(256))
    scheduler_spec = KvtierCpuSpec(config)
    try:
        assert worker_spec.num_chunks == 640
        assert any("host pool clamped from 64.00 MiB" in r.message for r in kvtier_logs.records)
        manager = scheduler_spec.get_manager()
        assert scheduler_spec.num_chunks == 640
        assert manager.primary_tier.get_kv_memoryview().shape == (640, PAGE)
        assert not region_path(engine_id).exists()  # unlinked once everyone mapped it
    finally:
        scheduler_spec.get_manager().shutdown()
        worker.shutdown()


def test_disk_backed_pool_is_one_sparse_file_shared_by_worker_and_scheduler(engine_id, tmp_path):
    folder = tmp_path / "pool"
    config = offloading_config(engine_id, 4 * 2**30, kvtier={"host_pool_dir": str(folder)})
    worker_spec = KvtierCpuSpec(config)
    kv = engine_kv(256)
    kv.tensors[0].tensor[5].fill_(7)
    worker = worker_spec.get_worker(kv)
    (pool_file,) = folder.iterdir()
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert pool_file.stat().st_size == 4 * 2**30  # larger than RAM is fine: sparse
    scheduler_spec = KvtierCpuSpec(config)
    manager = scheduler_spec.get_manager()
    try:
        assert list(folder.iterdir()) == []  # name dropped once every process mapped it
        from vllm.v1.kv_offload.base import GPULoadStoreSpec
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        worker.submit_store(1, GPULoadStoreSpec([5], [1], [0]), CPULoadStoreSpec([42]))
        worker.wait({1})
        row = manager.primary_tier.get_kv_memoryview()
        import numpy as np

        assert set(np.asarray(row)[42, :PAGE].tolist()) == {7}
        del row
    finally:
        manager.shutdown()
        worker.shutdown()
    assert list(folder.iterdir()) == []


def test_pool_clamped_below_the_engine_pool_is_refused_naming_the_memory_limit(
    engine_id, monkeypatch
):
    # 8 MiB spare after the floor: a 64 MiB pool would shrink to 128 rows, below 256 blocks
    snapshot = MemorySnapshot(total_bytes=2**30, available_bytes=(256 + 8) * MiB)
    monkeypatch.setattr(host_pool_module, "read_memory", lambda: snapshot)
    spec = KvtierCpuSpec(offloading_config(engine_id, 64 * MiB))
    with pytest.raises(
        ConfigError,
        match=r"tier sizing trap: .* shrunk to fit RAM: .*clamped "
        r"from 64.00 MiB to 8.00 MiB",
    ):
        spec.get_worker(engine_kv(256))
    assert not region_path(engine_id).exists()


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        ({"kvtier": {"allow_small_tiers": "yes"}}, r"allow_small_tiers \(allow_small_tiers"),
        ({"kvtier": {"pool_dir": "/x"}}, r"unknown host pool option\(s\) \['pool_dir'\]"),
        ({"kvtier_host_pool_dir": "/x"}, r"unknown option\(s\) \['kvtier_host_pool_dir'\]"),
        (
            {"secondary_tiers": [{"type": "KvtierDiskTier", "root_dir": "/x", "fsync": "no"}]},
            r"invalid disk tier option: fsync \(fsync / --fsync\)='no'",
        ),
        (
            {"secondary_tiers": [{"type": "KvtierDiskTier", "root_dir": "/x", "cap": 1}]},
            r"unknown disk tier option\(s\) \['cap'\]",
        ),
    ],
)
def test_bad_options_refuse_start_up_before_any_pool_exists(engine_id, extra, match):
    with pytest.raises(ConfigError, match=match):
        KvtierCpuSpec(offloading_config(engine_id, 64 * MiB, **extra))
    assert not region_path(engine_id).exists()


@pytest.mark.parametrize(
    ("variable", "value", "match"),
    [
        ("KVTIER_LOG_LEVEL", "loud", r"^kvtier: KVTIER_LOG_LEVEL='loud': .*; use one of DEBUG, "),
        ("KVTIER_SHM_MIN_AGE_S", "soon", r"^kvtier: KVTIER_SHM_MIN_AGE_S='soon': .*; give seconds"),
    ],
)
def test_a_bad_kvtier_variable_refuses_start_up_before_any_pool_exists(
    engine_id, monkeypatch, variable, value, match
):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError, match=match):
        KvtierCpuSpec(offloading_config(engine_id, 64 * MiB))
    assert not region_path(engine_id).exists()


def test_an_unusable_disk_folder_refuses_start_up_before_any_pool_exists(engine_id, tmp_path):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("x")
    tier = {"type": "KvtierDiskTier", "module_path": "kvtier.vllm.disk_tier"}
    with pytest.raises(ConfigError, match="disk_dir"):
        KvtierCpuSpec(
            offloading_config(
                engine_id, 64 * MiB, secondary_tiers=[{**tier, "root_dir": str(not_a_folder)}]
            )
        )
    assert not region_path(engine_id).exists()


def test_a_scheduler_that_fails_to_start_removes_the_pool_file(engine_id, monkeypatch):
    config = offloading_config(engine_id, 32 * MiB)
    worker = KvtierCpuSpec(config).get_worker(engine_kv(256))
    try:
        assert region_path(engine_id).exists()
        scheduler_spec = KvtierCpuSpec(config)

        def broken_manager(self):
            raise RuntimeError("a secondary tier failed to start")

        monkeypatch.setattr(TieringOffloadingSpec, "get_manager", broken_manager)
        with pytest.raises(RuntimeError, match="failed to start"):
            scheduler_spec.get_manager()
        assert not region_path(engine_id).exists()
    finally:
        worker.shutdown()


def test_one_start_up_line_names_every_tier_once_they_are_open(engine_id, tmp_path, kvtier_logs):
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    disk = {
        "type": "KvtierDiskTier",
        "module_path": "kvtier.vllm.disk_tier",
        "root_dir": str(tmp_path / "disk"),
        "capacity_bytes": "64MiB",
    }
    config = offloading_config(engine_id, 32 * MiB, secondary_tiers=[disk])
    worker = KvtierCpuSpec(config).get_worker(engine_kv(256))
    manager = KvtierCpuSpec(config).get_manager()
    try:
        line = startup_line(kvtier_logs)
        assert "host pool 32.00 MiB (33,554,432 B) = 512 rows = 65,536 tokens" in line
        assert f"disk {tmp_path / 'disk'}: cap 64.00 MiB (67,108,864 B) = 963 records" in line
        assert "namespace " in line and "fsync never" in line
        assert line.endswith("; decision: unmeasured until the engine's first prefills")
    finally:
        manager.shutdown()
        worker.shutdown()


def test_the_scheduler_spec_and_its_encrypted_tier_read_the_key_file_once(
    engine_id, tmp_path, kvtier_logs, monkeypatch
):
    # The spec reads the key while it checks the options (a bad file refuses the start before
    # any pool exists) and hands it to the tier it builds, which reads no file again: not to
    # refuse a bad one, nor for its sealers, its store or its part of the start-up line. (The
    # worker's spec reads its own: another process, except under vLLM's uniprocess executor.)
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    path = key_file(tmp_path, bytes(range(32)))
    disk = {
        "type": "KvtierDiskTier",
        "module_path": "kvtier.vllm.disk_tier",
        "root_dir": str(tmp_path / "disk"),
        "capacity_bytes": "64MiB",
        "encryption": {"key_files": [path]},
    }
    config = offloading_config(engine_id, 32 * MiB, secondary_tiers=[disk])
    worker = KvtierCpuSpec(config).get_worker(engine_kv(256))
    reads = key_file_reads(monkeypatch)
    manager = KvtierCpuSpec(config).get_manager()
    try:
        line = startup_line(kvtier_logs)
        assert "encrypted (AES-256-GCM" in line
        assert reads == [path]
    finally:
        manager.shutdown()
        worker.shutdown()
