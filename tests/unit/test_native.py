"""Building and loading the optional native page copier."""

import logging
import shutil
from pathlib import Path

import pytest

from kvtier import native


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KVTIER_CACHE_DIR", str(tmp_path))
    return tmp_path / "native"


def test_a_failing_compiler_gives_the_memmove_path_with_a_warning(
    cache: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("CC", "/bin/false")
    with caplog.at_level(logging.WARNING):
        assert native.page_copier.__wrapped__() is None
    assert "using memmove" in caplog.text
    assert [p.name for p in cache.glob("*.so*")] == [], "no half-built library left behind"


def test_no_compiler_gives_the_memmove_path(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert native.page_copier.__wrapped__() is None


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler here")
def test_the_library_is_built_once_and_reused(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CC", raising=False)
    assert native.page_copier.__wrapped__() is not None
    [library] = cache.glob("streamcopy-*.so")
    built = library.stat().st_mtime_ns
    assert native.page_copier.__wrapped__() is not None
    assert library.stat().st_mtime_ns == built
    assert (library.stat().st_mode & 0o777) & 0o022 == 0, "not writable by others"
