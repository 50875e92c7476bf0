"""Helpers of the engine-level fault tests: engine configs sized for faults, the exact oracle.

Engines here are small on purpose: 40 engine KV blocks (5,120 tokens), a 16 MiB host pool
(64 rows), a 24 MiB disk cap (94 records of 256 KiB): each tier holds more than the one before
it (no sizing trap), and a few dozen prompts already make every tier evict.
"""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import kvtier
from kvtier.bench.harness import Engine, EngineConfig, GenerateResult
from kvtier.format import Namespace
from kvtier.store import DiskStore
from kvtier.units import parse_size
from tests.support.oracle import ResumeReference, check_restore

BLOCK_TOKENS = 128
PROMPT_LEN = 1000
FULL_BLOCK_TOKENS = 896
MAX_TOKENS = 8
ENGINE_BLOCKS = 40
HOST_POOL = "16MiB"
DISK_CAP = "24MiB"
DISK_CAP_BYTES = parse_size(DISK_CAP, "disk cap")


def kvtier_engine(
    model: Path, disk_dir: Path, engine_id: str, free_space_floor_bytes: int | None = None
) -> EngineConfig:
    """A kvtier engine on ``disk_dir`` whose host-pool file is named after ``engine_id``."""
    # The data path is under test: every hit is restored (with the tiny model recompute is
    # about as fast as a restore, so the decision may rightly refuse one).
    transfer = kvtier.kv_transfer_config(
        host_pool=HOST_POOL, disk_dir=disk_dir, disk_capacity=DISK_CAP, restore_decision=False
    )
    transfer["engine_id"] = engine_id
    if free_space_floor_bytes is not None:
        (tier,) = transfer["kv_connector_extra_config"]["secondary_tiers"]
        tier["free_space_floor_bytes"] = free_space_floor_bytes
    return EngineConfig(
        model=str(model),
        kv_transfer_config=transfer,
        extra_args={"num_gpu_blocks_override": ENGINE_BLOCKS},
    )


def unique_engine_id(name: str) -> str:
    return f"kvtier-faults-{name}-{os.getpid()}-{time.monotonic_ns() % 10**9}"


@dataclass
class Oracle:
    """Resume references for any number of cached tokens, from an engine without offloading.

    ``expected(prompt, k)`` serves ``prompt[:k]`` and then ``prompt`` on a reset engine, so the
    reference resumes from exactly ``k`` cached tokens, as the checked request did (0: a cold
    run). Results are memoised.
    """

    plain: Engine
    max_tokens: int = MAX_TOKENS
    _memo: dict[tuple[tuple[int, ...], int], ResumeReference] = field(default_factory=dict)

    def expected(self, prompt: list[int], cached_tokens: int) -> ResumeReference:
        key = (tuple(prompt), cached_tokens)
        if key not in self._memo:
            assert self.plain.reset_prefix_cache()
            if cached_tokens:
                self.plain.generate_one(prompt[:cached_tokens], 1)
            result, _ = self.plain.generate_one(prompt, self.max_tokens)
            assert result.num_cached_tokens == cached_tokens, (
                f"oracle resumed from {result.num_cached_tokens}, want {cached_tokens}"
            )
            self._memo[key] = ResumeReference(tuple(result.token_ids), cached_tokens)
        return self._memo[key]

    def check(self, prompt: list[int], result: GenerateResult) -> None:
        """``result`` equals the plain engine resuming from as many cached tokens."""
        assert result.num_cached_tokens % BLOCK_TOKENS == 0
        check_restore(result, self.expected(prompt, result.num_cached_tokens))


def namespace_dir(disk_dir: Path, model: Path) -> Path:
    """The engine's namespace folder under ``disk_dir`` (others may sit beside it)."""
    for folder in sorted(p for p in disk_dir.iterdir() if p.is_dir()):
        try:
            ns = Namespace.from_json((folder / "namespace.json").read_text())
        except (OSError, ValueError):
            continue
        if ns.model == str(model):
            return folder
    raise AssertionError(f"no namespace folder of {model} under {disk_dir}")


def wait_for_namespace_dir(disk_dir: Path, model: Path, timeout_s: float = 120) -> Path:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return namespace_dir(disk_dir, model)
        except (AssertionError, FileNotFoundError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def sole_namespace_dir(disk_dir: Path) -> Path:
    """The one namespace folder of a disk folder only one engine has used."""
    (ns,) = [p for p in disk_dir.iterdir() if p.is_dir()]
    return ns


def record_files(ns_dir: Path) -> set[Path]:
    return set((ns_dir / "blocks").rglob("*.kvb"))


#: Shorter than a block: serving it stores nothing, but the engine steps (``until_offloaded``).
STEP_PROMPT = [11, 12, 13, 14]


def until_offloaded(engine: Engine, done: Callable[[], bool], timeout_s: float = 60.0) -> None:
    """Step the engine with tiny requests until ``done()`` (e.g. the disk holds a prompt's
    blocks), before a ``reset_prefix_cache(reset_connector=True)`` that must leave them there.

    vLLM submits a step's stores at the start of the next step and cascades host-pool blocks
    to the tiers behind it in later steps still; the reset drains only the tier jobs already
    submitted and drops the rest with the host pool. An engine that stops stepping right after
    a request (the common case on a busy machine) can therefore hold that request's last blocks
    in the host pool only, and a test that resets at once finds them nowhere.
    """
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise AssertionError(f"the tiers did not receive the blocks in {timeout_s:.0f} s")
        engine.generate_one(STEP_PROMPT, 1)
        time.sleep(0.05)


def record_stems(paths: set[Path] | list[Path]) -> set[str]:
    """The record names of ``paths`` without the writer's suffix (one per block key)."""
    return {p.name.split(".")[0] for p in paths}


def store_on_disk_only(
    engine: Engine,
    ns_dir: Path,
    prompt: list[int],
    max_tokens: int = MAX_TOKENS,
    cache_salt: str | None = None,
) -> list[Path]:
    """Serve ``prompt`` (with ``cache_salt``); return the record files it added (one per whole
    block), with only the disk holding them."""
    before = record_files(ns_dir)
    engine.generate_one(prompt, max_tokens, cache_salt=cache_salt)
    # New files, not a larger count: a capped folder evicts older records meanwhile.
    want = len(prompt) // BLOCK_TOKENS
    until_offloaded(engine, lambda: len(record_files(ns_dir) - before) >= want)
    assert engine.reset_prefix_cache(reset_connector=True)  # waits for in-flight stores
    added = sorted(record_files(ns_dir) - before)
    assert len(added) == want, f"{len(added)} records stored, {want} expected"
    return added


def side_store(ns_dir: Path) -> DiskStore:
    """Open the engine's store folder from the test process (a second process on it)."""
    ns = Namespace.from_json((ns_dir / "namespace.json").read_text())
    return DiskStore(ns_dir.parent, ns, DISK_CAP_BYTES)


def quarantined(ns_dir: Path) -> set[str]:
    """Names of the quarantine entries (only the newest 64 are kept: compare sets)."""
    from kvtier.store.disk.quarantine import entries

    return set(entries(ns_dir))


def reasons(names: set[str]) -> list[str]:
    """The reasons in quarantine entry names (``<key>.<id>.<reason>.<ns>.kvb``)."""
    return sorted(name.split(".")[2] for name in names)


def disk_usage(ns_dir: Path) -> int:
    return sum(os.lstat(p).st_size for p in record_files(ns_dir))


def charged_usage(root: Path) -> int:
    """What the folder's index should charge: every record, trashed and quarantined file of
    every namespace under ``root``, each rounded up to 4 KiB (kvtier.store.disk.schema). The
    store's own folders (``blocks/`` fan-out) are not charged; a quarantined entry is, whole,
    folders included (a folder planted in place of a record: kvtier.store.disk.quarantine)."""
    entries = [os.lstat(p) for sub in ("blocks", "tmp") for p in root.glob(f"*/{sub}/**/*")]
    files = [e for e in entries if not stat.S_ISDIR(e.st_mode)]
    quarantined = [os.lstat(p) for p in root.glob("*/quarantine/**/*")]
    return sum(-(-e.st_size // 4096) * 4096 for e in files + quarantined)


def folders_usage(root: Path) -> int:
    """What ``du`` counts for the folders under ``root`` (the root included, quarantine's
    contents excluded: they are charged as entries), each at least one 4 KiB unit: what the
    folder's footprint must add to its files since folders count against the cap."""
    total = 0
    for dirpath, dirnames, _files in os.walk(root):
        st = os.lstat(dirpath)
        total += max(-(-st.st_size // 4096), -(-st.st_blocks * 512 // 4096), 1) * 4096
        if os.path.basename(dirpath) == "quarantine":
            dirnames.clear()
    return total


def metric(engine: Engine, name: str) -> float:
    return engine.metrics().get(name, 0.0)


def dump(obj: object) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
