"""The shared tier: a ``BlockStore`` on Redis/Valkey (standalone or Cluster), verified.

Importing this package imports redis-py; ``kvtier.store`` does not import it, so the disk
and memory tiers work without the client installed. The store's configuration is
``kvtier.settings.SharedTierSettings`` (the same model the vLLM tier parses) and its URL
forms are ``kvtier.shared_url``'s.
"""

from kvtier.settings import SharedTierSettings
from kvtier.shared_url import ServerUrl, parse_url
from kvtier.store.shared.stats import SharedStoreStats
from kvtier.store.shared.store import KEY_PREFIX, SharedStore

__all__ = [
    "KEY_PREFIX",
    "ServerUrl",
    "SharedStore",
    "SharedStoreStats",
    "SharedTierSettings",
    "parse_url",
]
