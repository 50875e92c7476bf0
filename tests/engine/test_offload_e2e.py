"""End to end against real vLLM engine processes: host restore, disk restore, restart, cleanup.

Engines: one without offloading (the resume oracle) and two kvtier engines sharing a disk
folder, the second started after the first is gone. Prompts are 1000 tokens: 7 full 128-token
blocks plus a tail, so restore and oracle resume from the same 896 cached tokens.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig, ProcessEngine
from kvtier.hostpool.regions import SHM_DIR
from tests.support.engine import BLOCK_TOKENS, until_offloaded
from tests.support.oracle import ResumeReference, check_restore, resume_reference
from tests.support.prompts import random_prompt
from tests.support.regions import regions_left_by

pytestmark = pytest.mark.engine

PROMPT_LEN = 1000
FULL_BLOCK_TOKENS = 896
MAX_TOKENS = 16
PROMPTS = {
    name: random_prompt(seed, PROMPT_LEN)
    for seed, name in enumerate(["host", "disk", "restart"], start=100)
}


def disk_records(disk_dir: Path) -> set[Path]:
    return set(disk_dir.rglob("blocks/**/*.kvb"))


def delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


EXTERNAL = "vllm:prompt_tokens_by_source{source=external_kv_transfer}"
FROM_HOST = "vllm:prompt_tokens_cached_by_source{source=host}"
FROM_DISK = "vllm:prompt_tokens_cached_by_source{source=disk}"


@pytest.fixture(scope="module")
def references(plain_engine) -> dict[str, ResumeReference]:
    return {
        name: resume_reference(plain_engine, prompt, MAX_TOKENS) for name, prompt in PROMPTS.items()
    }


@pytest.fixture(scope="module")
def disk_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("disk-tier")


def kvtier_config(tiny_model: Path, disk_dir: Path, **env: str) -> EngineConfig:
    return EngineConfig(
        model=str(tiny_model),
        # Eviction here is an explicit prefix-cache reset, so tiers smaller than the
        # engine pool still serve restores: opt out of the sizing guard.
        kv_transfer_config=kvtier.kv_transfer_config(
            restore_decision=False,  # the data path is under test: restore every hit
            host_pool="256MiB",
            disk_dir=disk_dir,
            allow_small_tiers=True,
        ),
        env=dict(env),
    )


@pytest.fixture(scope="module")
def first_engine(start_engine, tiny_model, disk_dir, references) -> ProcessEngine:
    return start_engine(kvtier_config(tiny_model, disk_dir), "kvtier-first")


def test_prompt_evicted_from_the_engine_is_restored_from_the_host_pool(first_engine, references):
    prompt = PROMPTS["host"]
    cold, _ = first_engine.generate_one(prompt, MAX_TOKENS)
    assert cold.num_cached_tokens == 0
    assert first_engine.reset_prefix_cache()
    before = first_engine.metrics()
    restored, _ = first_engine.generate_one(prompt, MAX_TOKENS)
    after = first_engine.metrics()

    assert restored.num_cached_tokens == FULL_BLOCK_TOKENS
    assert delta(after, before, EXTERNAL) == FULL_BLOCK_TOKENS
    assert delta(after, before, FROM_HOST) == FULL_BLOCK_TOKENS
    assert references["host"].num_cached_tokens == FULL_BLOCK_TOKENS
    check_restore(restored, references["host"])


def test_prompt_dropped_from_the_host_pool_is_restored_from_disk(
    first_engine, references, disk_dir
):
    prompt = PROMPTS["disk"]
    before = disk_records(disk_dir)
    first_engine.generate_one(prompt, MAX_TOKENS)
    want = FULL_BLOCK_TOKENS // BLOCK_TOKENS
    until_offloaded(first_engine, lambda: len(disk_records(disk_dir) - before) >= want)
    # reset_connector also empties the host pool; the disk tier keeps its blocks by design
    assert first_engine.reset_prefix_cache(reset_connector=True)
    before = first_engine.metrics()
    restored, _ = first_engine.generate_one(prompt, MAX_TOKENS)
    after = first_engine.metrics()

    assert restored.num_cached_tokens == FULL_BLOCK_TOKENS
    assert delta(after, before, FROM_DISK) == FULL_BLOCK_TOKENS
    assert delta(after, before, EXTERNAL) == FULL_BLOCK_TOKENS
    check_restore(restored, references["disk"])


def test_clean_shutdown_leaves_no_host_pool_file(first_engine):
    first_engine.generate_one(PROMPTS["restart"], MAX_TOKENS)  # stored for the restart test
    assert first_engine.close() == 0
    assert regions_left_by(first_engine.log_path) == set()


def group_is_gone(pgid: int, timeout_s: float = 30.0) -> bool:
    """True once no process of the group is left (SIGKILLed members take a moment to go)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def leak_a_region(name: str) -> Path:
    """A host-pool file as a SIGKILLed stock engine leaves it: created, sized, holder dead."""
    path = SHM_DIR / name
    subprocess.run(
        [
            sys.executable,
            "-c",
            "import os,sys; fd=os.open(sys.argv[1], os.O_CREAT|os.O_EXCL|os.O_RDWR, 0o600); "
            "os.ftruncate(fd, 1<<20); os.kill(os.getpid(), 9)",
            str(path),
        ],
        check=False,
    )
    assert path.exists()
    return path


def test_fresh_process_serves_the_prefix_from_disk_on_its_first_request(
    start_engine, tiny_model, disk_dir, references, first_engine
):
    assert first_engine._proc.poll() is not None, "runs after the first engine is gone"
    leaked = leak_a_region("vllm_offload_kvtier-test-dead-engine.mmap")
    engine = start_engine(
        kvtier_config(tiny_model, disk_dir, KVTIER_SHM_MIN_AGE_S="0"), "kvtier-restart"
    )
    assert not leaked.exists(), "the leaked region of a dead engine is removed at start-up"

    before = engine.metrics()
    restored, _ = engine.generate_one(PROMPTS["restart"], MAX_TOKENS)
    after = engine.metrics()
    assert restored.num_cached_tokens == FULL_BLOCK_TOKENS
    assert delta(after, before, FROM_DISK) == FULL_BLOCK_TOKENS
    check_restore(restored, references["restart"])

    # SIGKILL of the whole engine (API-server style force kill): nothing may stay in /dev/shm
    engine.kill()
    assert regions_left_by(engine.log_path) == set()
    assert group_is_gone(engine._proc.pid), "EngineCore and workers die with the session"
