"""The shared tier end to end: replicas with their own disk folders share one server.

Engine A serves a prompt and stops (its stores drain to the server). Engine B, a fresh process
with an empty disk folder, serves the same prompt: it must find the blocks on the server
(vLLM's lookups ask it about keys B never stored), restore them, match the resume oracle, and
write them back to its own disk. The same through a 3-master Cluster. Tenants (``cache_salt``)
on one server never restore each other's blocks.
"""

from collections.abc import Iterator
from pathlib import Path

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig, ProcessEngine
from tests.support.oracle import check_restore, resume_reference
from tests.support.prompts import random_prompt
from tests.support.redis_servers import (
    server_binary,
    start_cluster,
    start_standalone,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPT_LEN = 1000
MAX_TOKENS = 16
RESTORED = 896  # the prompt's full 128-token blocks but the last (vLLM recomputes one token)


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    if server_binary() is None:
        pytest.skip("no redis-server on PATH (run scripts/redis-server.sh)")
    standalone = start_standalone(tmp_path_factory.mktemp("shared-e2e-standalone"))
    cluster = start_cluster(tmp_path_factory.mktemp("shared-e2e-cluster"))
    yield {"standalone": standalone.url, "cluster": cluster.url}
    standalone.kill()
    cluster.stop()


def replica(start_engine, tiny_model: Path, url: str, disk: Path, name: str) -> ProcessEngine:
    config = EngineConfig(
        model=str(tiny_model),
        kv_transfer_config=kvtier.kv_transfer_config(
            restore_decision=False,  # the data path is under test: restore every hit
            host_pool="128MiB",
            disk_dir=disk,
            disk_capacity="512MiB",
            shared=url,
            allow_small_tiers=True,  # evictions here are explicit prefix-cache resets
        ),
        in_process=True,
    )
    return start_engine(config, name)


def records(disk: Path) -> list[Path]:
    return list(disk.rglob("*.kvb"))


@pytest.mark.parametrize("kind", ["standalone", "cluster"])
def test_a_prefix_served_by_one_replica_is_restored_by_another(
    kind, servers, start_engine, tiny_model, plain_engine, tmp_path
):
    prompt = random_prompt(400 + len(kind), PROMPT_LEN)
    reference = resume_reference(plain_engine, prompt, MAX_TOKENS)
    first = replica(start_engine, tiny_model, servers[kind], tmp_path / "a", f"{kind}-a")
    served, _ = first.generate_one(prompt, MAX_TOKENS)
    assert served.num_cached_tokens == 0
    first.close()  # drains its stores to the disk and the server

    second = replica(start_engine, tiny_model, servers[kind], tmp_path / "b", f"{kind}-b")
    assert records(tmp_path / "b") == [], "replica b starts with an empty disk"
    restored, _ = second.generate_one(prompt, MAX_TOKENS)
    assert restored.num_cached_tokens == RESTORED, "b restored a's prefix from the server"
    check_restore(restored, reference)
    # written back: after evicting the host pool, b restores from its own disk
    assert second.reset_prefix_cache(reset_connector=True)
    # (off the restore path, on the store's write-back thread: the files follow the request)
    assert wait_until(lambda: len(records(tmp_path / "b")) >= RESTORED // 128, 60)
    again, _ = second.generate_one(prompt, MAX_TOKENS)
    assert again.num_cached_tokens == RESTORED
    check_restore(again, reference)
    second.close()


def test_tenants_on_one_server_never_restore_each_others_blocks(
    servers, start_engine, tiny_model, tmp_path
):
    prompt = random_prompt(410, PROMPT_LEN)
    writer = replica(start_engine, tiny_model, servers["standalone"], tmp_path / "w", "tenant-w")
    writer.generate_one(prompt, MAX_TOKENS, cache_salt="tenant-a")
    writer.close()
    reader = replica(start_engine, tiny_model, servers["standalone"], tmp_path / "r", "tenant-r")
    other, _ = reader.generate_one(prompt, MAX_TOKENS, cache_salt="tenant-b")
    assert other.num_cached_tokens == 0, "tenant b must not get tenant a's blocks"
    same, _ = reader.generate_one(prompt, MAX_TOKENS, cache_salt="tenant-a")
    assert same.num_cached_tokens > 0
    reader.close()
