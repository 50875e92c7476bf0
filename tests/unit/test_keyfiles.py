"""Master keys: private files or KVTIER_MASTER_KEY, refusals that name the fix, and no key in
any repr, exception, log line or settings dump."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.format.keyfiles import TierKeyRings, load_keyring, read_key_file
from kvtier.format.sealing import MasterKey
from kvtier.settings import DiskTierSettings, EncryptionSettings, SharedTierSettings
from kvtier.store import DiskStore
from tests.support.key_files import key_file_reads
from tests.support.store import disk_capacity, key_of, make_namespace, payload_of

SECRET = bytes(range(7, 39))
OTHER = bytes(range(50, 82))


def key_file(tmp_path: Path, secret: bytes = SECRET, mode: int = 0o600, hexed: bool = True) -> Path:
    path = tmp_path / f"key-{secret[:2].hex()}"
    path.write_bytes((secret.hex() + "\n").encode() if hexed else secret)
    os.chmod(path, mode)
    return path


def forms(secret: bytes) -> list[str]:
    """Every way a key could leak into text."""
    return [secret.hex(), secret.hex().upper(), repr(secret), secret.decode("latin-1")]


def test_a_private_hex_key_file_loads(tmp_path: Path) -> None:
    ring = load_keyring(EncryptionSettings(key_files=(key_file(tmp_path),)))
    assert ring.write_key_id == MasterKey(SECRET).key_id


def test_a_raw_key_file_loads_too(tmp_path: Path) -> None:
    assert read_key_file(key_file(tmp_path, hexed=False)).key_id == MasterKey(SECRET).key_id


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_key_file_others_can_read_is_refused_naming_chmod(tmp_path: Path, mode: int) -> None:
    path = key_file(tmp_path, mode=mode)
    with pytest.raises(ConfigError, match=rf"encryption_key_files .*{oct(mode)}.*chmod 600 {path}"):
        read_key_file(path)


def test_a_read_only_key_file_is_accepted(tmp_path: Path) -> None:
    assert read_key_file(key_file(tmp_path, mode=0o400)).key_id == MasterKey(SECRET).key_id


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file away needs root")
def test_a_key_file_of_another_user_is_refused_naming_chown(tmp_path: Path) -> None:
    path = key_file(tmp_path)
    os.chown(path, 12345, -1)
    with pytest.raises(ConfigError, match=rf"belongs to uid 12345.*chown {os.geteuid()} {path}"):
        read_key_file(path)


def test_a_symlinked_key_file_is_refused(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(key_file(tmp_path))
    with pytest.raises(ConfigError, match="is a symlink; give the key file itself"):
        read_key_file(link)


def test_a_missing_key_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        read_key_file(tmp_path / "nope")


def test_a_malformed_key_is_described_never_echoed(tmp_path: Path) -> None:
    path = tmp_path / "bad"
    path.write_text("not-a-key-but-a-secret-phrase\n")
    os.chmod(path, 0o600)
    with pytest.raises(ConfigError) as caught:
        read_key_file(path)
    assert "secret-phrase" not in str(caught.value) and "openssl rand -hex 32" in str(caught.value)


def test_keys_come_from_the_environment_in_order() -> None:
    environ = {"KVTIER_MASTER_KEY": f"{OTHER.hex()}, {SECRET.hex()}"}
    ring = load_keyring(EncryptionSettings(key_env=True), environ)
    assert ring.key_ids == (MasterKey(OTHER).key_id, MasterKey(SECRET).key_id)


def test_an_unset_environment_variable_is_refused_naming_it() -> None:
    with pytest.raises(ConfigError, match="KVTIER_MASTER_KEY is not set"):
        load_keyring(EncryptionSettings(key_env=True), {})


def test_a_bad_environment_key_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError) as caught:
        load_keyring(EncryptionSettings(key_env=True), {"KVTIER_MASTER_KEY": SECRET.hex()[:-2]})
    assert SECRET.hex()[:-2] not in str(caught.value)
    assert "KVTIER_MASTER_KEY (key 1)" in str(caught.value)


def test_settings_need_exactly_one_key_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="exactly one place"):
        EncryptionSettings()
    with pytest.raises(ConfigError, match="exactly one place"):
        EncryptionSettings(key_files=(tmp_path / "k",), key_env=True)


def test_require_cache_salt_is_a_strict_bool(tmp_path: Path) -> None:
    assert EncryptionSettings(key_env=True, require_cache_salt=True).require_cache_salt
    with pytest.raises(ConfigError) as caught:
        EncryptionSettings(key_env=True, require_cache_salt="yes")
    assert "require_cache_salt (require_cache_salt / --require-cache-salt)" in str(caught.value)


def test_the_shared_tier_behind_a_disk_tier_takes_its_keys(tmp_path: Path) -> None:
    enc = EncryptionSettings(key_env=True)
    shared = SharedTierSettings(url="redis://h:1", encryption=enc)
    with pytest.raises(ConfigError, match="give the encryption options once, on the disk tier"):
        DiskTierSettings(root_dir=tmp_path, shared=shared, encryption=enc)


def test_encryption_settings_round_trip_through_the_tier_dict(tmp_path: Path) -> None:
    disk = DiskTierSettings(
        root_dir=tmp_path, encryption=EncryptionSettings(key_files=(key_file(tmp_path),))
    )
    options = {k: v for k, v in disk.to_tier_config().items() if k not in ("type", "module_path")}
    again = DiskTierSettings.parse(options)
    assert again == disk
    assert TierKeyRings().for_tier(again) is not None
    assert TierKeyRings().for_tier(DiskTierSettings(root_dir=tmp_path)) is None


def test_tiers_with_the_same_encryption_share_one_ring_read_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = key_file(tmp_path)
    encryption = EncryptionSettings(key_files=(path,))
    disk = DiskTierSettings(root_dir=tmp_path, encryption=encryption)
    shared = SharedTierSettings(url="redis://cache:6379", encryption=encryption)
    reads = key_file_reads(monkeypatch)
    rings = TierKeyRings()
    ring = rings.for_tier(disk)
    assert ring is not None and rings.for_tier(disk) is ring and rings.for_tier(shared) is ring
    assert reads == [str(path)]
    assert TierKeyRings().for_tier(disk) is not ring, "another engine reads its own"


def test_no_key_appears_in_reprs_errors_or_logs(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Everything kvtier prints while keys are loaded, records sealed, damaged and refused."""
    caplog.set_level(logging.DEBUG)
    files = (key_file(tmp_path, SECRET), key_file(tmp_path, OTHER))
    settings = EncryptionSettings(key_files=files)
    ring = load_keyring(settings)
    sealer = ring.tenant()
    text = [repr(settings), str(settings.to_dict()), repr(ring), repr(sealer), repr(ring.keys)]
    store = DiskStore(
        tmp_path / "root",
        make_namespace(),
        disk_capacity(4),
        free_space_floor_bytes=0,
        sealer=sealer,
    )
    store.put(key_of(1), payload_of(1))
    path = store.record_path(key_of(1))
    assert path is not None
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    assert store.get(key_of(1)) is None  # logs the quarantine
    text.append(repr(store.stats()))
    store.close()
    os.chmod(files[0], 0o644)
    try:
        load_keyring(settings)
    except ConfigError as exc:
        text.append(str(exc))
    environ = {"KVTIER_MASTER_KEY": SECRET.hex() + "zz"}
    try:
        load_keyring(EncryptionSettings(key_env=True), environ)
    except ConfigError as exc:
        text.append(str(exc))
    text += [r.getMessage() for r in caplog.records]
    blob = "\n".join(text)
    derived = [k for tk in sealer._keys for k in (tk.data_key, tk.name_key)]
    for secret in (SECRET, OTHER, *derived):
        for form in forms(secret):
            assert form not in blob
