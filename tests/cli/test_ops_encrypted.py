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


def test_verify_with_the_key_finds_a_record_planted_under_another_name(
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
    keyed = kvtier("verify", root, "--key-file", write_key(tmp_path, SECRET))
    assert keyed.exit_code == 1 and "auth" in keyed.stdout


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
