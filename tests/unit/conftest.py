"""Fixtures shared by the unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.record_files import o_direct_folder


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """``tmp_path`` where it takes O_DIRECT (skips elsewhere)."""
    return o_direct_folder(tmp_path)
