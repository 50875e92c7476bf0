"""``check_root``: the vLLM adapter's fail-closed preflight of ``disk_dir``."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.store import DiskStore, check_root
from kvtier.store.disk.index import SCHEMA_VERSION
from tests.support.faults import bind_readonly, need_mounts, unmount
from tests.support.host import chown_unavailable, need
from tests.support.store import disk_capacity, make_namespace


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def readonly(tmp_path: Path) -> Iterator[Path]:
    """A folder (mode 0777, owned by us) under a read-only bind mount."""
    need_mounts()
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o777)
    bind_readonly(folder)
    try:
        yield folder
    finally:
        unmount(folder)


def test_a_missing_folder_passes_and_nothing_is_created(tmp_path: Path) -> None:
    check_root(tmp_path / "a" / "b")
    assert listing(tmp_path) == []


def test_a_good_folder_with_a_store_passes(tmp_path: Path) -> None:
    DiskStore(tmp_path / "r", make_namespace(), disk_capacity(2)).close()
    before = listing(tmp_path)
    check_root(tmp_path / "r")
    assert listing(tmp_path) == before


def test_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"disk_dir=.*/f is not a folder; give a folder path"):
        check_root(tmp_path / "f")


def test_a_folder_under_a_file_is_refused_and_nothing_is_created(tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"disk_dir=.*/f is not a folder"):
        check_root(tmp_path / "f" / "sub")
    assert listing(tmp_path) == ["f"]


def test_a_symlink_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(ConfigError, match=r"disk_dir=.*/link is a symlink .*give the real folder"):
        check_root(tmp_path / "link")


def test_a_folder_of_another_user_is_refused(tmp_path: Path) -> None:
    need(chown_unavailable())
    folder = tmp_path / "theirs"
    folder.mkdir(mode=0o700)
    os.chown(folder, 65534, 65534)
    with pytest.raises(
        ConfigError, match=r"disk_dir=.* belongs to uid 65534.*use a folder you own"
    ):
        check_root(folder)


def test_a_read_only_folder_is_refused_even_for_root(readonly: Path) -> None:
    subprocess.run(["mount", "-o", "remount,bind,rw", str(readonly)], check=True)
    readonly.chmod(0o700)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(readonly)], check=True)
    with pytest.raises(ConfigError, match=r"disk_dir=.*cannot write in .*give a folder this user"):
        check_root(readonly)


def test_a_missing_folder_under_a_read_only_parent_is_refused(readonly: Path) -> None:
    with pytest.raises(ConfigError, match=r"disk_dir=.*/ro/sub: cannot write in .*/ro \("):
        check_root(readonly / "sub")


def test_unsafe_permissions_that_cannot_be_fixed_are_refused(readonly: Path) -> None:
    with pytest.raises(ConfigError, match=r"writable by group or others .*cannot be fixed"):
        check_root(readonly)


def test_unsafe_permissions_of_our_own_folder_are_fixed_and_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    folder = tmp_path / "open"
    folder.mkdir()
    folder.chmod(0o777)
    with caplog.at_level("WARNING", logger="kvtier.store.disk.root"):
        check_root(folder)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert "made it private" in caplog.text and "0o777" in caplog.text, caplog.text


def test_an_index_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "r"
    DiskStore(root, make_namespace(), disk_capacity(2)).close()
    conn = sqlite3.connect(root / "index.sqlite3")
    with conn:
        conn.execute(
            "UPDATE meta SET value = ? WHERE name = 'schema_version'", (SCHEMA_VERSION + 1,)
        )
    conn.close()
    before = listing(tmp_path)
    with pytest.raises(ConfigError, match=r"disk_dir: .* newer kvtier wrote this folder"):
        check_root(root)
    assert listing(tmp_path) == before
