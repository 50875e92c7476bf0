"""kv_transfer_config's and kvtier serve's encryption options: where they land, what is refused."""

from __future__ import annotations

import json
import shlex

import pytest
from typer.testing import CliRunner

import kvtier
from kvtier.cli.main import app
from kvtier.errors import ConfigError


def tiers(config: dict) -> list[dict]:
    return config["kv_connector_extra_config"]["secondary_tiers"]


def test_the_disk_tier_carries_the_encryption_and_the_shared_tier_behind_it_none(tmp_path):
    config = kvtier.kv_transfer_config(
        disk_dir=tmp_path, shared="redis://h:1", encryption_key_files=["/etc/kvtier/key"]
    )
    (disk,) = tiers(config)
    assert disk["encryption"]["key_files"] == ["/etc/kvtier/key"]
    assert disk["shared"]["encryption"] is None


def test_a_shared_tier_alone_carries_its_own_encryption():
    (shared,) = tiers(kvtier.kv_transfer_config(shared="redis://h:1", encryption_key_env=True))
    assert shared["encryption"] == {"key_files": [], "key_env": True, "require_cache_salt": False}


def test_no_key_travels_in_the_config(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTIER_MASTER_KEY", "ab" * 32)
    config = kvtier.kv_transfer_config(disk_dir=tmp_path, encryption_key_env=True)
    assert "ab" * 32 not in json.dumps(config)


def test_encryption_without_a_tier_to_encrypt_is_refused():
    with pytest.raises(ConfigError, match="no disk or shared tier to encrypt"):
        kvtier.kv_transfer_config(encryption_key_env=True)


def test_require_cache_salt_reaches_the_disk_tiers_encryption(tmp_path):
    cfg = kvtier.kv_transfer_config(
        disk_dir=tmp_path, encryption_key_env=True, require_cache_salt=True
    )
    (tier,) = cfg["kv_connector_extra_config"]["secondary_tiers"]
    assert tier["encryption"]["require_cache_salt"] is True
    assert cfg["kv_connector_module_path"] == "kvtier.vllm.connector"


def test_serve_passes_the_key_files_not_the_keys(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "m",
            "--dry-run",
            "--disk-dir",
            str(tmp_path),
            "--encryption-key-file",
            "/k/new",
            "--encryption-key-file",
            "/k/old",
        ],
    )
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert tiers(config)[0]["encryption"]["key_files"] == ["/k/new", "/k/old"]
