"""Every fingerprinted vLLM release against what its kvtier API generation needs, without a
download: the fingerprints (tests/vllm/contracts/*.json, written by
scripts/vllm_fingerprint.py) are facts read from the published wheels, and
``tests/vllm/contracts/required.py`` lists the facts each generation relies on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.vllm.contracts import HERE, load_fingerprint, releases
from tests.vllm.contracts.required import (
    GENERATION,
    GENERATIONS,
    KV,
    UNCOVERED,
    needs_for,
    problems,
)

REPO = Path(__file__).resolve().parents[2]
COVERED = sorted(release for release, generation in GENERATION.items() if generation)


def test_every_fingerprint_is_declared_and_every_declared_release_fingerprinted():
    assert sorted(releases()) == sorted(GENERATION)


@pytest.mark.parametrize(("distribution", "version"), COVERED)
def test_release_meets_its_generations_needs(distribution, version):
    fp = load_fingerprint(distribution, version)
    assert problems(fp, needs_for(distribution, version)) == []


@pytest.mark.parametrize(("distribution", "version"), UNCOVERED)
def test_release_between_generations_meets_none_of_them(distribution, version):
    """0.27.0 to 0.30.0 mix two generations' interfaces; each generation names what breaks."""
    fp = load_fingerprint(distribution, version)
    for generation, needs in GENERATIONS.items():
        assert problems(fp, needs), f"{distribution}=={version} meets {generation}"


def _mutate_field_name(fp):
    fields = fp["modules"][KV + "tiering/base.py"]["classes"]["JobResult"]["fields"]
    fields[1][0] = "succeeded"


def _mutate_param(fp):
    tier = fp["modules"][KV + "tiering/base.py"]["classes"]["SecondaryTierManager"]
    tier["methods"]["__init__"]["params"][2][0] = "primary_view"


def _mutate_registry(fp):
    fp["modules"][KV + "tiering/factory.py"]["registry"].pop()


def _mutate_private_attribute(fp):
    factory = fp["modules"][KV + "tiering/factory.py"]["classes"]["SecondaryTierFactory"]
    attributes = factory["class_attributes"]
    if "_registry" in attributes:
        attributes["_tiers"] = attributes.pop("_registry")
    for field in factory["fields"]:
        if field[0] == "_registry":
            field[0] = "_tiers"


def _mutate_call(fp):
    sched = fp["modules"]["vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py"]
    calls = sched["behaviour"]["OffloadingConnectorScheduler._build_store_jobs"]["calls"]
    calls[calls.index("self.manager.prepare_store")] = "self.manager.reserve_store"


@pytest.mark.parametrize(
    "mutate",
    [_mutate_field_name, _mutate_param, _mutate_registry, _mutate_private_attribute, _mutate_call],
)
@pytest.mark.parametrize(("distribution", "version"), [("vllm", "0.25.1"), ("vllm", "0.34.0")])
def test_a_fingerprint_edited_by_one_field_fails(tmp_path, mutate, distribution, version):
    fp = load_fingerprint(distribution, version)
    mutate(fp)
    copy = tmp_path / "edited.json"
    copy.write_text(json.dumps(fp))
    found = problems(json.loads(copy.read_text()), needs_for(distribution, version))
    assert len(found) == 1, found
    assert found[0].startswith(f"{distribution}=={version}: ")


@pytest.mark.parametrize(
    ("version", "torch"),
    [
        ("0.25.1", "torch==2.11.0"),
        ("0.26.0", "torch==2.11.0"),
        ("0.27.0", "torch==2.13.0"),
        ("0.32.0", "torch==2.13.0"),
        ("0.33.0", "torch==2.14.0"),
        ("0.34.0", "torch==2.14.0"),
    ],
)
def test_torch_pin_is_recorded(version, torch):
    """Which torch a release needs decides where it can run (the GPU hosts have 2.11)."""
    assert load_fingerprint("vllm", version)["requires"]["torch"] == [torch]


def test_fingerprints_hold_facts_not_source():
    """Only names and short annotations or defaults: no vLLM code in the repository."""

    def strings(value):
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            for key, item in value.items():
                yield key
                yield from strings(item)
        elif isinstance(value, list):
            for item in value:
                yield from strings(item)

    for distribution, version in releases():
        for text in strings(load_fingerprint(distribution, version)):
            assert len(text) <= 160 and "\n" not in text, (version, text[:80])


def test_0_25_1_is_the_wheel_the_copied_sources_came_from():
    fp = load_fingerprint("vllm", "0.25.1")
    assert fp["wheel"] == "vllm-0.25.1-cp38-abi3-manylinux_2_28_x86_64.whl"
    assert fp["wheel_sha256"] == (
        "16fc7a28df1576eb6f7ca0455026551b8f9adb674c19c66059359ef3e964bd1e"
    )


def test_script_rewrites_the_0_25_1_fingerprint_identically_when_the_wheel_is_cached(tmp_path):
    cache = Path(os.environ.get("KVTIER_CACHE_DIR", Path.home() / ".cache" / "kvtier"))
    if not sorted((cache / "wheels").glob("vllm-0.25.1-*.whl")):
        pytest.skip(f"no vllm-0.25.1 wheel in {cache / 'wheels'} (run scripts/vllm_fingerprint.py)")
    script = REPO / "scripts" / "vllm_fingerprint.py"
    code = (
        "import runpy, sys, pathlib; m = runpy.run_path(sys.argv[1]); "
        "w = m['wheel_for']('vllm==0.25.1', m['cache_dir']()); "
        "pathlib.Path(sys.argv[2]).write_text(m['dumps'](m['fingerprint']('vllm==0.25.1', w)))"
    )
    out = tmp_path / "vllm-0.25.1.json"
    subprocess.run([sys.executable, "-c", code, str(script), str(out)], check=True)
    assert out.read_text() == (HERE / "vllm-0.25.1.json").read_text()


def test_0_26_0_has_0_25_1s_tier_interface_but_a_config_built_spec():
    """What API 0.26 changes from API 0.25: only the spec side (the
    spec built from an ``OffloadingConfig``, the region's ``engine_id``, the pool's
    ``kv_bytes_per_chunk``, a ``Locality`` enum); tier jobs, results, the tier base, the
    request context, the factory and ``NONE_HASH`` are 0.25.1's."""
    fp = load_fingerprint("vllm", "0.26.0")
    broken = {need.what for need in GENERATIONS["0.25"] if problems(fp, [need])}
    assert broken == {
        "no tier medium or locality (stand-ins)",
        "no OffloadingConfig (the geometry comes from vllm_config)",
        "the spec is built from vllm_config and kv_cache_config",
        "the geometry Api025.offloading_view reads off the spec",
        "the tiering spec's constructor",
        "vLLM's host pool size (host_pool_rows: num_blocks)",
        "the region's keywords (region_kwargs)",
    }


def test_every_supported_release_is_fingerprinted_under_its_implementations_generation():
    """The release package's table against the contract data: each release kvtier starts on
    is checked (above) against the needs of the generation that serves it."""
    from kvtier.vllm.release import SUPPORTED

    for (distribution, version), api in SUPPORTED.items():
        assert GENERATION[(distribution, version)] == api, (distribution, version)
        assert needs_for(distribution, version), (distribution, version)
