"""Encryption at rest inside a real engine: sealed disk records restore equal to the oracle, a
damaged one is recomputed, and a restart with a rotated key still restores the old records."""

import os
from pathlib import Path

import pytest

import kvtier
from kvtier.bench.harness import EngineConfig
from kvtier.format.sealing import NAME_BYTES
from tests.support.engine import sole_namespace_dir, store_on_disk_only
from tests.support.oracle import check_restore, resume_reference
from tests.support.prompts import random_prompt

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

PROMPT_LEN = 1000
MAX_TOKENS = 16
RESTORED = 896  # 7 whole 128-token blocks of the 1000-token prompt
FROM_DISK = "vllm:prompt_tokens_cached_by_source{source=disk}"


def key_file(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(os.urandom(32).hex().encode())
    os.chmod(path, 0o600)
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> tuple[Path, Path, Path]:
    keys = tmp_path_factory.mktemp("keys")
    return tmp_path_factory.mktemp("disk"), key_file(keys, "old"), key_file(keys, "new")


def config(model: Path, disk_dir: Path, *keys: Path) -> EngineConfig:
    return EngineConfig(
        model=str(model),
        kv_transfer_config=kvtier.kv_transfer_config(
            restore_decision=False,  # the data path is under test: restore every hit
            host_pool="128MiB",
            disk_dir=disk_dir,
            disk_capacity="512MiB",
            allow_small_tiers=True,
            encryption_key_files=[str(k) for k in keys],
        ),
        in_process=True,
    )


def test_sealed_records_restore_recompute_when_damaged_and_survive_a_key_rotation(
    start_engine, tiny_model, folders, plain_engine
):
    disk_dir, old, new = folders
    engine = start_engine(config(tiny_model, disk_dir, old), "kvtier-encrypted")
    prompt = random_prompt(400, PROMPT_LEN)
    reference = resume_reference(plain_engine, prompt, MAX_TOKENS)
    added = store_on_disk_only(engine, sole_namespace_dir(disk_dir), prompt, MAX_TOKENS)
    # Names are 16-byte MACs, not vLLM's 36-byte keys; payloads are ciphertext.
    assert all(len(p.name.split(".")[0]) == 2 * NAME_BYTES for p in added)
    before = engine.metrics()
    restored, _ = engine.generate_one(prompt, MAX_TOKENS)
    assert restored.num_cached_tokens == RESTORED
    assert engine.metrics()[FROM_DISK] - before.get(FROM_DISK, 0) == RESTORED
    check_restore(restored, reference)

    damaged_prompt = random_prompt(401, PROMPT_LEN)
    cold, _ = plain_engine.generate_one(damaged_prompt, MAX_TOKENS)
    for path in store_on_disk_only(
        engine, sole_namespace_dir(disk_dir), damaged_prompt, MAX_TOKENS
    ):
        with open(path, "r+b") as f:  # one ciphertext bit, past the 4 KiB header
            f.seek(4096 + 1000)
            byte = f.read(1)
            f.seek(4096 + 1000)
            f.write(bytes([byte[0] ^ 0x01]))
    result, _ = engine.generate_one(damaged_prompt, MAX_TOKENS)
    assert result.num_cached_tokens == 0, "no tampered block may be served"
    assert result.token_ids == cold.token_ids
    ns = sole_namespace_dir(disk_dir)
    quarantined = list((ns / "quarantine").glob("*.kvb"))
    assert quarantined and all(".auth." in p.name for p in quarantined)
    engine.close()

    rotated = start_engine(config(tiny_model, disk_dir, new, old), "kvtier-encrypted-rotated")
    again, _ = rotated.generate_one(prompt, MAX_TOKENS)
    assert again.num_cached_tokens == RESTORED, "records under the old key are still read"
    check_restore(again, reference)
