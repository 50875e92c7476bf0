"""Store files are private and the root must be a private, real folder."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from kvtier.errors import ConfigError
from kvtier.store import DiskStore
from tests.support.store import key_of, make_namespace, payload_of


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_files_are_0600_and_folders_0700_whatever_the_umask(
    open_disk: Callable[..., DiskStore],
) -> None:
    old = os.umask(0)
    try:
        store = open_disk()
        store.put(key_of(1), payload_of(1))
    finally:
        os.umask(old)
    for dirpath, _dirnames, filenames in os.walk(store.root):
        assert mode(Path(dirpath)) == 0o700, dirpath
        for name in filenames:
            assert mode(Path(dirpath) / name) == 0o600, name


def test_root_that_is_a_symlink_is_refused_with_the_fix(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError, match=r"is a symlink .*give the real folder"):
        DiskStore(link, make_namespace(), 64 << 20)


def test_world_writable_root_is_refused_with_the_fix(tmp_path: Path) -> None:
    root = tmp_path / "open"
    root.mkdir()
    root.chmod(0o777)
    with pytest.raises(ConfigError, match=r"writable by group or others .*chmod 700"):
        DiskStore(root, make_namespace(), 64 << 20)


def test_group_writable_namespace_folder_is_refused(open_disk: Callable[..., DiskStore]) -> None:
    store = open_disk()
    store.close()
    store.namespace_dir.chmod(0o770)
    with pytest.raises(ConfigError, match=r"namespace folder .* writable by group"):
        open_disk()


def test_namespace_folder_that_is_a_symlink_is_refused(
    root: Path, open_disk: Callable[..., DiskStore], tmp_path: Path
) -> None:
    store = open_disk()
    store.close()
    elsewhere = tmp_path / "elsewhere"
    store.namespace_dir.rename(elsewhere)
    store.namespace_dir.symlink_to(elsewhere)
    with pytest.raises(ConfigError, match="is a symlink"):
        open_disk()


def test_root_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a folder"):
        DiskStore(tmp_path / "file", make_namespace(), 64 << 20)


@pytest.mark.parametrize("capacity", [0, 4096])
def test_capacity_too_small_is_refused_with_an_example(tmp_path: Path, capacity: int) -> None:
    with pytest.raises(ConfigError, match=f"capacity_bytes={capacity}; give a size such as"):
        DiskStore(tmp_path / "r", make_namespace(), capacity)


def test_unknown_fsync_policy_is_refused_with_the_choices(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="fsync='sometimes'; choose one of"):
        DiskStore(tmp_path / "r", make_namespace(), 64 << 20, fsync="sometimes")
