"""Opening a ``SharedStore`` in tests: its settings built from a URL and keyword options."""

from __future__ import annotations

from typing import Any

from kvtier.format import Namespace
from kvtier.format.sealing import RecordSealer
from kvtier.settings import SharedTierSettings
from kvtier.store.shared import SharedStore


def open_shared(
    url: str, namespace: Namespace, sealer: RecordSealer | None = None, **options: Any
) -> SharedStore:
    """``SharedStore`` over ``SharedTierSettings.parse({"url": url, **options})``: a bad
    option is the same ``ConfigError`` the engine would raise. ``sealer``: sealed values."""
    settings = SharedTierSettings.parse({"url": url, **options})
    return SharedStore(settings, namespace, sealer=sealer)
