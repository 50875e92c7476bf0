"""Opening a ``SharedStore`` in tests: its settings built from a URL and keyword options."""

from __future__ import annotations

from typing import Any

from kvtier.format import Namespace
from kvtier.settings import SharedTierSettings
from kvtier.store.shared import SharedStore


def open_shared(url: str, namespace: Namespace, **options: Any) -> SharedStore:
    """``SharedStore`` over ``SharedTierSettings.parse({"url": url, **options})``: a bad
    option is the same ``ConfigError`` the engine would raise."""
    return SharedStore(SharedTierSettings.parse({"url": url, **options}), namespace)
