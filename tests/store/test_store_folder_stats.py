"""The folders' charge measured in one native call per folder listing and per batch of puts:
the same charges as one ``lstat`` a folder (``kvtier.store.disk.folders``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtier import native
from kvtier.store.disk import folders, layout

NATIVE = native.folder_stats() is not None


def make_tree(root: Path) -> None:
    """A root as a store leaves it, plus what the measurement must skip or survive: a file, a
    link to a folder, a folder of many names (grown past one allocation unit)."""
    blocks = root / "ns" / layout.BLOCKS
    for fan in ("00", "7f", "ff"):
        (blocks / fan).mkdir(parents=True)
    for sub in ("tmp", "sessions"):
        (root / "ns" / sub).mkdir()
    crowded = blocks / "00"
    for i in range(400):
        (crowded / f"{i:064x}.1.rec").write_bytes(b"")
    (blocks / "not-a-folder").write_bytes(b"x")
    os.symlink(root / "ns" / "tmp", blocks / "link")


@pytest.mark.skipif(not NATIVE, reason="the native record writer is not built here")
def test_native_listing_and_measuring_agree_with_lstat(tmp_path: Path) -> None:
    make_tree(tmp_path)
    sizes, listing = native.folder_stats()  # type: ignore[misc]
    blocks = tmp_path / "ns" / layout.BLOCKS
    listed = {os.fsdecode(name): (size, n) for name, size, n in listing(os.fsencode(blocks))}
    assert sorted(listed) == ["00", "7f", "ff"], "folders only, links not followed"
    for name, (size, n) in listed.items():
        st = os.lstat(blocks / name)
        assert (size, n) == (st.st_size, st.st_blocks)
    assert listed["00"][0] > 4096, "the crowded folder grew past one unit"
    assert listing(os.fsencode(tmp_path / "missing")) is None
    paths = [blocks / "00", blocks / "not-a-folder", blocks / "link", tmp_path / "missing"]
    st = os.lstat(blocks / "00")
    assert sizes([os.fsencode(p) for p in paths]) == [(st.st_size, st.st_blocks), None, None, None]


@pytest.mark.skipif(native.file_sizes() is None, reason="the native record writer is not built")
def test_native_file_sizes_agree_with_lstat_and_statvfs(tmp_path: Path) -> None:
    measure = native.file_sizes()
    assert measure is not None
    (tmp_path / "file").write_bytes(b"x" * 5000)
    paths = [tmp_path / "file", tmp_path / "missing", tmp_path]
    found, free = measure([os.fsencode(p) for p in paths], os.fsencode(tmp_path))
    st = os.lstat(tmp_path / "file")
    assert found[:2] == [(5000, st.st_blocks), None]
    assert found[2] == (os.lstat(tmp_path).st_size, os.lstat(tmp_path).st_blocks)
    space = os.statvfs(tmp_path)
    assert free is not None and abs(free - space.f_bavail * space.f_frsize) < 256 << 20
    assert measure([os.fsencode(tmp_path / "file")], None) == ([(5000, st.st_blocks)], None)
    with pytest.raises(NotADirectoryError):
        measure([os.fsencode(tmp_path / "file" / "below")], None)
    with pytest.raises(FileNotFoundError):
        measure([], os.fsencode(tmp_path / "missing"))


def test_the_root_s_charges_are_the_same_with_or_without_the_native_calls(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_tree(tmp_path)
    measured = folders.folder_charges(tmp_path)
    monkeypatch.setattr(native, "folder_stats", lambda: None)
    assert folders.folder_charges(tmp_path) == measured
    assert set(measured) == {
        tmp_path,
        tmp_path / "ns",
        tmp_path / "ns" / "tmp",
        tmp_path / "ns" / "sessions",
        tmp_path / "ns" / layout.BLOCKS,
        *(tmp_path / "ns" / layout.BLOCKS / fan for fan in ("00", "7f", "ff")),
    }
    assert measured[tmp_path / "ns" / layout.BLOCKS / "00"] > 4096


def test_a_batch_s_folders_are_measured_in_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Regression: every folder a batch of puts wrote into was one lstat, and one GIL hand-over,
    # each: with hashed keys a batch of 16 writes into up to 16 fan-out folders.
    make_tree(tmp_path)
    calls: list[int] = []

    def sizes(paths: list[bytes]) -> list[tuple[int, int] | None]:
        calls.append(len(paths))
        found = []
        for path in paths:
            st = os.lstat(path)
            found.append((st.st_size, st.st_blocks))
        return found

    monkeypatch.setattr(native, "folder_stats", lambda: (sizes, lambda path: []))
    charge = folders.FolderCharge(tmp_path, clock=lambda: 0.0)
    charge.charge()
    blocks = tmp_path / "ns" / layout.BLOCKS
    charge.note_put(blocks / "00", blocks / "7f", blocks / "ff", tmp_path / "ns" / "tmp")
    assert calls[-1] == 4 and len(calls) == 2  # the root at the measurement, then the batch


@pytest.mark.skipif(native.file_sizes() is None, reason="the native record writer is not built")
def test_the_native_path_calls_refuse_what_is_not_a_list_of_bytes(tmp_path: Path) -> None:
    """Their shared prologue (``path_names``) raises, and leaks nothing, where a path is not
    bytes or the argument no sequence; an empty list is measured as nothing."""
    sizes, _ = native.folder_stats()  # type: ignore[misc]
    measure, unlink = native.file_sizes(), native.files_unlinker()
    assert measure is not None and unlink is not None
    for call in (sizes, lambda paths: measure(paths, None), unlink):
        with pytest.raises(TypeError):
            call([os.fsencode(tmp_path), str(tmp_path)])
        with pytest.raises(TypeError):
            call(7)
        assert call([]) in ([], ([], None))
    (tmp_path / "kept").mkdir()
    assert unlink([os.fsencode(tmp_path / "kept"), os.fsencode(tmp_path / "gone")])[1] == 0
    assert (tmp_path / "kept").is_dir(), "a folder is never unlinked"
