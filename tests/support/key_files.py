"""Master key files for encrypted tiers' tests, and a count of the reads kvtier makes of them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kvtier.format import keyfiles


def key_file(folder: Path, secret: bytes) -> str:
    """A private (0600) file in ``folder`` holding ``secret`` in hex, as an operator makes one."""
    path = folder / f"key{secret[0]}"
    path.write_text(secret.hex())
    os.chmod(path, 0o600)
    return str(path)


def key_file_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every key file kvtier reads from now on, one entry a read (``read_key_file`` counted)."""
    reads: list[str] = []
    read = keyfiles.read_key_file

    def counted(path: Path) -> object:
        reads.append(str(path))
        return read(path)

    monkeypatch.setattr(keyfiles, "read_key_file", counted)
    return reads
