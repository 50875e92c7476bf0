"""Encryption at rest on the shared tier, end to end: a replica restores from the server what
another stored sealed, equal to the oracle; the server holds no block hash; a replica with
another key restores nothing and answers as a cold prefill does."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import kvtier
from kvtier.bench.harness import EngineConfig, ProcessEngine
from kvtier.format.sealing import NAME_BYTES
from tests.support.oracle import check_restore, resume_reference
from tests.support.prompts import random_prompt
from tests.support.redis_servers import RedisServer, server_binary, start_standalone

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPT_LEN = 1000
MAX_TOKENS = 16
RESTORED = 896


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    if server_binary() is None:
        pytest.skip("no redis-server on PATH (run scripts/redis-server.sh)")
    started = start_standalone(tmp_path_factory.mktemp("sealed-shared-e2e"))
    yield started
    started.kill()


def key_file(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(os.urandom(32).hex().encode())
    os.chmod(path, 0o600)
    return path


def replica(start_engine, model: Path, url: str, disk: Path, key: Path, name: str) -> ProcessEngine:
    config = EngineConfig(
        model=str(model),
        kv_transfer_config=kvtier.kv_transfer_config(
            restore_decision=False,
            host_pool="128MiB",
            disk_dir=disk,
            disk_capacity="512MiB",
            shared=url,
            allow_small_tiers=True,
            encryption_key_files=[str(key)],
        ),
        in_process=True,
    )
    return start_engine(config, name)


def test_a_sealed_prefix_is_restored_by_a_replica_with_the_key_and_by_no_other(
    server, start_engine, tiny_model, plain_engine, tmp_path
):
    key, other_key = key_file(tmp_path, "key"), key_file(tmp_path, "other")
    prompt = random_prompt(500, PROMPT_LEN)
    reference = resume_reference(plain_engine, prompt, MAX_TOKENS)
    assert plain_engine.reset_prefix_cache()
    cold, _ = plain_engine.generate_one(prompt, MAX_TOKENS)
    assert cold.num_cached_tokens == 0, "a cold prefill, what the stranger must answer"
    first = replica(start_engine, tiny_model, server.url, tmp_path / "a", key, "sealed-a")
    first.generate_one(prompt, MAX_TOKENS)
    first.close()  # drains its stores to the disk and the server

    server_keys = redis.Redis(port=server.port).keys("kvt:*")
    assert len(server_keys) >= PROMPT_LEN // 128
    assert all(len(k.split(b":")[2]) == 2 * NAME_BYTES for k in server_keys)

    second = replica(start_engine, tiny_model, server.url, tmp_path / "b", key, "sealed-b")
    restored, _ = second.generate_one(prompt, MAX_TOKENS)
    assert restored.num_cached_tokens == RESTORED, "b restored a's sealed prefix"
    check_restore(restored, reference)
    second.close()

    stranger = replica(start_engine, tiny_model, server.url, tmp_path / "c", other_key, "sealed-c")
    result, _ = stranger.generate_one(prompt, MAX_TOKENS)
    assert result.num_cached_tokens == 0, "another key finds none of the records"
    assert result.token_ids == cold.token_ids
