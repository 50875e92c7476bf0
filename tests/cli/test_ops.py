"""`kvtier ls/du/verify/gc` over folders written by DiskStore directly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtier.cli.main import app
from kvtier.cli.ops import parse_age
from kvtier.errors import ConfigError
from kvtier.format import HEADER_BYTES
from kvtier.store import DiskStore
from kvtier.store.disk.index import charge
from tests.support.store import (
    PAYLOAD_BYTES,
    disk_capacity,
    key_of,
    make_namespace,
    payload_of,
)

RECORD = charge(HEADER_BYTES + PAYLOAD_BYTES)
runner = CliRunner()


def kvtier(*args: object) -> object:
    return runner.invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})


def fill(root: Path, model: str, keys: range) -> DiskStore:
    """A closed store of namespace ``model`` holding ``keys`` (put in that order)."""
    store = DiskStore(root, make_namespace(model=model), disk_capacity(16), 0)
    for i in keys:
        assert store.put(key_of(i), payload_of(i))
    store.close()
    return store


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "kv"


def test_ls_lists_namespaces_with_model_layout_and_blocks(root: Path) -> None:
    a, b = fill(root, "org/a", range(3)), fill(root, "org/b", range(10, 12))
    result = kvtier("ls", root, "--json")
    assert result.exit_code == 0, result.output
    rows = {r["namespace"]: r for r in json.loads(result.stdout)["namespaces"]}
    assert rows[a.namespace.digest_hex()]["model"] == "org/a"
    assert rows[a.namespace.digest_hex()]["blocks"] == 3
    assert rows[b.namespace.digest_hex()]["bytes"] == 2 * RECORD
    assert rows[b.namespace.digest_hex()]["layout"] == "float32 2x2x64 16 tok/block"
    text = kvtier("ls", root)
    assert text.exit_code == 0 and "org/a" in text.stdout and "3 blocks" in text.stdout


def test_ls_of_a_namespace_lists_its_blocks_newest_first(root: Path) -> None:
    a = fill(root, "org/a", range(3))
    result = kvtier("ls", root, a.namespace.digest_hex(), "--json")
    assert result.exit_code == 0, result.output
    keys = [b["key"] for b in json.loads(result.stdout)["blocks"]]
    assert keys == [key_of(i).hex() for i in (2, 1, 0)]


def test_du_reports_cap_usage_and_floor(root: Path) -> None:
    fill(root, "org/a", range(3))
    result = kvtier("du", root, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["capacity_bytes"] == disk_capacity(16)
    assert report["used_bytes"] == 3 * RECORD
    assert report["used_bytes"] < report["footprint_bytes"] <= report["capacity_bytes"]
    assert report["quarantine_entries"] == 0 and report["floor_bytes"] > 0
    assert [n["blocks"] for n in report["namespaces"]] == [3]


def test_verify_exits_1_on_a_damaged_record_and_fix_quarantines_it(root: Path) -> None:
    store = DiskStore(root, make_namespace(), disk_capacity(16), 0)
    for i in range(3):
        store.put(key_of(i), payload_of(i))
    path = store.record_path(key_of(1))
    store.close()
    assert path is not None
    clean = kvtier("verify", root)
    assert clean.exit_code == 0, clean.output
    assert "0 problems" in clean.stdout
    with open(path, "r+b") as f:
        f.seek(HEADER_BYTES + 7)
        f.write(b"\xff")
    found = kvtier("verify", root, "--json")
    assert found.exit_code == 1
    (problems,) = json.loads(found.stdout)["namespaces"].values()
    assert [(p["kind"], p["fixed"]) for p in problems] == [("corrupt", False)]
    fixed = kvtier("verify", root, "--fix", "--json")
    assert fixed.exit_code == 1  # problems were found (and fixed)
    assert kvtier("verify", root).exit_code == 0
    assert kvtier("du", root, "--json").exit_code == 0
    assert json.loads(kvtier("du", root, "--json").stdout)["quarantine_entries"] == 1


def test_gc_to_size_evicts_least_recently_used_first(root: Path) -> None:
    fill(root, "org/a", range(6))
    before = json.loads(kvtier("du", root, "--json").stdout)["footprint_bytes"]
    result = kvtier("gc", root, "--to", before - 2 * RECORD, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records"] == 2
    with DiskStore(root, make_namespace(model="org/a"), None, 0) as store:
        assert sorted(store.keys()) == [key_of(i) for i in range(2, 6)]
        assert store.verify() == []


def test_gc_namespace_older_than_and_quarantine(root: Path) -> None:
    a, b = fill(root, "org/a", range(3)), fill(root, "org/b", range(3))
    result = kvtier("gc", root, "--namespace", a.namespace.digest_hex(), "--json")
    assert json.loads(result.stdout)["records"] == 3
    assert json.loads(kvtier("gc", root, "--older-than", "1w", "--json").stdout)["records"] == 0
    assert json.loads(kvtier("gc", root, "--older-than", "0s", "--json").stdout)["records"] == 3
    usage = json.loads(kvtier("du", root, "--json").stdout)
    assert usage["used_bytes"] == 0 and usage["trash_bytes"] == 0
    assert kvtier("gc", root, "--quarantine").exit_code == 0
    assert b.namespace_dir.is_dir()


def test_errors_have_exit_codes_and_go_to_stderr(root: Path, tmp_path: Path) -> None:
    missing = kvtier("du", tmp_path / "nothing")
    assert missing.exit_code == 3 and missing.stdout == ""
    assert "cannot read the folder" in missing.stderr
    not_kvtier = tmp_path / "plain"
    not_kvtier.mkdir()
    assert kvtier("ls", not_kvtier).exit_code == 3
    assert not (not_kvtier / "index.sqlite3").exists()
    fill(root, "org/a", range(1))
    assert kvtier("gc", root).exit_code == 2
    assert kvtier("gc", root, "--older-than", "soon").exit_code == 2
    assert kvtier("gc", root, "--to", "lots").exit_code == 2
    unknown = kvtier("ls", root, "0" * 32)
    assert unknown.exit_code == 2 and "no namespace" in unknown.stderr


def test_ages_parse_with_units() -> None:
    assert parse_age("90") == 90 and parse_age("15m") == 900 and parse_age("2w") == 14 * 86400
    with pytest.raises(ConfigError, match="--older-than"):
        parse_age("-1d")
