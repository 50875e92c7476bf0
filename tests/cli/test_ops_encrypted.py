"""`kvtier ls/du/verify/gc` over an encrypted folder, with the key and without it."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtier.cli.main import app
from kvtier.format import HEADER_BYTES, compute_checksum
from kvtier.format.record import decode_header, encode_header
from kvtier.format.sealing import KeyRing, MasterKey
from kvtier.store import DiskStore
from tests.support.store import disk_capacity, make_namespace, payload_of

SECRET = bytes(range(3, 35))
NEW = bytes(range(90, 122))
runner = CliRunner()


def kvtier(*args: object) -> object:
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def block_key(i: int) -> bytes:
    return hashlib.sha256(b"block %d" % i).digest() + bytes(4)


def write_key(folder: Path, secret: bytes) -> Path:
    path = folder / f"key-{secret[0]}"
    path.write_text(secret.hex())
    os.chmod(path, 0o600)
    return path


def fill(root: Path, *secrets: bytes, blocks: range = range(3)) -> DiskStore:
    ring = KeyRing([MasterKey(s) for s in secrets])
    store = DiskStore(root, make_namespace(), disk_capacity(16), 0, sealer=ring.tenant())
    for i in blocks:
        assert store.put(block_key(i), payload_of(i))
    store.close()
    return store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "kv"


def test_ls_marks_the_namespace_encrypted_and_lists_no_block_hash(root: Path) -> None:
    store = fill(root, SECRET)
    summary = json.loads(kvtier("ls", root, "--json").stdout)["namespaces"][0]
    assert summary["encrypted"] and summary["blocks"] == 3
    result = kvtier("ls", root, store.namespace.digest_hex())
    assert result.exit_code == 0
    assert "keyed MACs" in result.stderr
    for i in range(3):
        assert block_key(i)[:32].hex() not in result.stdout


def test_verify_without_the_key_checks_structure_and_says_what_it_could_not(root: Path) -> None:
    store = fill(root, SECRET)
    result = kvtier("verify", root)
    assert result.exit_code == 0, result.output
    assert "3 encrypted records not authenticated" in result.stdout
    data = json.loads(kvtier("verify", root, "--json").stdout)
    assert data["unopened"] == {store.namespace.digest_hex(): 3} and data["problems"] == 0


def test_verify_with_the_key_authenticates_every_record(root: Path, tmp_path: Path) -> None:
    fill(root, SECRET)
    result = kvtier("verify", root, "--key-file", write_key(tmp_path, SECRET), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["unopened"] == {}


def test_verify_with_the_key_counts_a_record_planted_under_another_name_and_keeps_it(
    root: Path, tmp_path: Path
) -> None:
    store = fill(root, SECRET)
    files = sorted((store.namespace_dir / "blocks").glob("*/*.kvb"))
    # Another record's ciphertext under the first one's header, its (keyless) checksum redone:
    # structure and checksum look right to a reader without the key; the tag refuses it.
    one, two = files[0].read_bytes(), files[1].read_bytes()
    name = one[48 : 48 + int.from_bytes(one[14:16], "little")]
    header = decode_header(one, store.namespace.digest(), name)
    swapped = dataclasses.replace(
        header, payload_checksum=compute_checksum(two[HEADER_BYTES:], header.checksum_alg)
    )
    files[0].write_bytes(encode_header(swapped) + two[HEADER_BYTES:])
    keyless = kvtier("verify", root)
    assert keyless.exit_code == 0 and "3 encrypted records not authenticated" in keyless.stdout
    # With the key the tag refuses it; so it would refuse another tenant's good record, which
    # it cannot be told from: counted, never fixed (an engine's load quarantines it).
    key = write_key(tmp_path, SECRET)
    keyed = kvtier("verify", root, "--key-file", key, "--fix")
    assert keyed.exit_code == 0, keyed.output
    assert "1 encrypted records not authenticated as the unsalted requests'" in keyed.stdout
    assert files[0].exists()


def fill_tenants(root: Path, *tenants: str | None) -> DiskStore:
    """One record per tenant, block i for the i-th tenant, in one store."""
    ring = KeyRing([MasterKey(SECRET)])
    store = DiskStore(root, make_namespace(), disk_capacity(16), 0, sealer=ring.tenant())
    for i, tenant in enumerate(tenants):
        assert store.tenant_view(ring.tenant(tenant)).put(block_key(i), payload_of(i))
    store.close()
    return store


def test_verify_as_a_tenant_authenticates_its_records_and_counts_the_others(
    root: Path, tmp_path: Path
) -> None:
    store = fill_tenants(root, "team-a", "team-a", "team-b", None)
    digest = store.namespace.digest_hex()
    key = write_key(tmp_path, SECRET)
    as_a = kvtier("verify", root, "--key-file", key, "--tenant", "team-a", "--json")
    assert as_a.exit_code == 0, as_a.output
    data = json.loads(as_a.stdout)
    assert data["tenant"] == "team-a" and data["problems"] == 0
    assert data["other_tenants"] == {digest: 2}
    unsalted = kvtier("verify", root, "--key-file", key, "--fix")
    assert unsalted.exit_code == 0, unsalted.output
    assert "3 encrypted records not authenticated as the unsalted requests'" in unsalted.stdout
    as_b = kvtier("verify", root, "--key-file", key, "--tenant", "team-b", "--json")
    assert json.loads(as_b.stdout)["other_tenants"] == {digest: 3}, "--fix removed nothing"


def test_verify_as_a_tenant_still_finds_a_damaged_record(root: Path, tmp_path: Path) -> None:
    store = fill_tenants(root, "team-a", "team-b")
    for path in (store.namespace_dir / "blocks").glob("*/*.kvb"):
        data = bytearray(path.read_bytes())
        data[HEADER_BYTES + 7] ^= 0x40
        path.write_bytes(bytes(data))
    result = kvtier("verify", root, "--key-file", write_key(tmp_path, SECRET), "--tenant", "x")
    assert result.exit_code == 1 and result.stdout.count(" corrupt ") == 2
    assert "2 problems" in result.stdout


def test_verify_as_a_tenant_needs_the_key(root: Path) -> None:
    fill(root, SECRET)
    result = kvtier("verify", root, "--tenant", "team-a")
    assert result.exit_code == 2
    assert "--tenant 'team-a'" in result.stderr and "--key-file" in result.stderr


def test_verify_with_a_key_file_others_can_read_is_a_usage_error(
    root: Path, tmp_path: Path
) -> None:
    fill(root, SECRET)
    path = write_key(tmp_path, SECRET)
    os.chmod(path, 0o644)
    result = kvtier("verify", root, "--key-file", path)
    assert result.exit_code == 2 and f"chmod 600 {path}" in result.stderr


def test_gc_retired_keys_drops_what_only_an_old_key_reads(root: Path, tmp_path: Path) -> None:
    fill(root, SECRET, blocks=range(3))
    fill(root, NEW, SECRET, blocks=range(10, 12))
    keys = (write_key(tmp_path, NEW), write_key(tmp_path, SECRET))
    result = kvtier("gc", root, "--retired-keys", "--key-file", keys[0], "--key-file", keys[1])
    assert result.exit_code == 0, result.output
    assert "evicted 3 blocks" in result.stdout
    ring = KeyRing([MasterKey(NEW)])
    with DiskStore(root, make_namespace(), sealer=ring.tenant(), free_space_floor_bytes=0) as s:
        assert all(s.get(block_key(i)) == payload_of(i) for i in range(10, 12))
        assert s.verify() == []


def test_gc_retired_keys_without_a_key_is_a_usage_error(root: Path) -> None:
    fill(root, SECRET)
    result = kvtier("gc", root, "--retired-keys")
    assert result.exit_code == 2 and "needs the current key" in result.stderr


def test_no_command_prints_a_key(root: Path, tmp_path: Path) -> None:
    fill(root, SECRET)
    path = write_key(tmp_path, SECRET)
    out = "".join(
        kvtier(*args).output
        for args in (
            ("ls", root, "--json"),
            ("du", root, "--json"),
            ("verify", root, "--key-file", path, "--json"),
            ("gc", root, "--retired-keys", "--key-file", path, "--json"),
        )
    )
    assert SECRET.hex() not in out and SECRET.hex().upper() not in out


def test_verify_help_documents_the_tenant_option() -> None:
    result = kvtier("verify", "--help")
    assert result.exit_code == 0
    assert "--tenant" in result.stdout and "cache_salt" in result.stdout
