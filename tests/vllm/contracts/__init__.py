"""Fingerprints of the vLLM releases kvtier is checked against, kept as data.

One JSON file per release (``<distribution>-<version>.json``), written by
``scripts/vllm_fingerprint.py`` from the published wheel: names, signatures, dataclass fields,
registries and a few behaviour facts, never vLLM's code. ``required.py`` says what each kvtier
release implementation needs from them. They live with the tests, not in the package: CI
checks kvtier against them without a download, and a user's installed vLLM is recognised by
its distribution version at start-up, so the wheel has no use for them.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def fingerprint_path(distribution: str, version: str) -> Path:
    return HERE / f"{distribution}-{version}.json"


@cache
def _load(path: Path) -> str:
    return path.read_text()


def load_fingerprint(distribution: str, version: str) -> dict[str, Any]:
    """A fresh copy of one release's fingerprint (callers may mutate it)."""
    return json.loads(_load(fingerprint_path(distribution, version)))


def releases() -> list[tuple[str, str]]:
    """(distribution, version) of every fingerprint kept here."""
    found = []
    for path in sorted(HERE.glob("*.json")):
        data = json.loads(_load(path))
        found.append((data["distribution"], data["version"]))
    return found
