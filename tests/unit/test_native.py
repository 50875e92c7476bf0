"""The native page copier: built with the package, only loaded at run time, optional."""

import logging
import os
import platform
import shutil
import subprocess
import sys

import numpy as np
import pytest

from kvtier import native
from kvtier.dataplane.copy_engine import copy_range

BUILDABLE = platform.machine() in ("x86_64", "AMD64") and bool(
    os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
)


def load() -> native.PageCopier | None:
    """A fresh ``page_copier()`` call, bypassing the per-process cache."""
    return native.page_copier.__wrapped__()


def pages(seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Sources and zeroed destinations: tiny, odd and streaming-sized pages, odd alignments."""
    rng = np.random.default_rng(seed)
    sizes = [0, 1, 63, 4095, 4096, 4097, 200_003, 65_536]
    arena = np.zeros(sum(sizes) + 64 * len(sizes), dtype=np.uint8)
    dsts, start = [], 0
    for i, size in enumerate(sizes):
        start += i % 16  # destinations at every alignment within a 16-byte line
        dsts.append(arena[start : start + size])
        start += size
    srcs = [rng.integers(0, 256, size, dtype=np.uint8) for size in sizes]
    return srcs, dsts


def plan(srcs: list[np.ndarray], dsts: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    def addresses(arrays: list[np.ndarray]) -> np.ndarray:
        return np.array([a.ctypes.data for a in arrays], dtype=np.uint64)

    return addresses(dsts), addresses(srcs), np.array([a.size for a in srcs], dtype=np.uint64)


@pytest.mark.skipif(not BUILDABLE, reason="no C compiler or not x86-64: nothing to build here")
def test_the_built_module_is_found_and_copies_every_page_exactly() -> None:
    copier = load()
    assert copier is not None, (
        "kvtier.native._streamcopy is not built: run `bash scripts/setup.sh` "
        "(python setup.py build_ext --inplace) in this clone"
    )
    srcs, dsts = pages(seed=1)
    dst, src, sizes = plan(srcs, dsts)
    copied = copier(len(sizes), dst.ctypes.data, src.ctypes.data, sizes.ctypes.data)
    assert copied == sum(a.size for a in srcs)
    for i, (s, d) in enumerate(zip(srcs, dsts, strict=True)):
        assert np.array_equal(s, d), f"page {i} ({s.size} bytes) differs"


@pytest.mark.skipif(not BUILDABLE, reason="no C compiler or not x86-64: nothing to build here")
def test_the_copier_refuses_bad_arguments_instead_of_crashing() -> None:
    copier = load()
    assert copier is not None
    with pytest.raises(TypeError, match="takes 4 integers"):
        copier(1, 2, 3)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="null"):
        copier(1, 0, 0, 0)
    with pytest.raises(OverflowError):
        copier(-1, 0, 0, 0)
    assert copier(0, 0, 0, 0) == 0


def test_loading_runs_no_compiler_or_subprocess(monkeypatch: pytest.MonkeyPatch) -> None:
    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"page_copier() tried to run something: {args}")

    monkeypatch.setattr(subprocess, "run", forbidden)
    monkeypatch.setattr(subprocess, "Popen", forbidden)
    monkeypatch.setattr(shutil, "which", forbidden)
    monkeypatch.setattr(os, "system", forbidden)
    # Re-import the extension too, so the import itself runs under the ban.
    monkeypatch.delitem(sys.modules, "kvtier.native._streamcopy", raising=False)
    copier = load()
    assert (copier is not None) == BUILDABLE


def test_a_missing_module_gives_the_memmove_path_with_one_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(sys.modules, "kvtier.native._streamcopy", None)  # import -> ImportError
    monkeypatch.setattr(native, "page_copier", native.page_copier.__wrapped__)
    with caplog.at_level(logging.WARNING, logger="kvtier.native"):
        assert native.page_copier() is None
    [record] = caplog.records
    assert "host pool copies use memmove" in record.getMessage()
    assert native.copier_name().startswith("memmove per page")


def test_without_the_module_copies_still_move_every_byte(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("kvtier.dataplane.copy_engine.page_copier", lambda: None)
    srcs, dsts = pages(seed=2)
    arrays = plan(srcs, dsts)
    copy_range(arrays, 0, len(srcs))
    for s, d in zip(srcs, dsts, strict=True):
        assert np.array_equal(s, d)
