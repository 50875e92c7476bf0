"""The shared tier: a ``BlockStore`` on Redis/Valkey (standalone or Cluster), verified.

Importing this package imports redis-py; ``kvtier.store`` does not import it, so the disk
and memory tiers work without the client installed.
"""

from kvtier.store.shared.config import ServerUrl, SharedStoreConfig, parse_url
from kvtier.store.shared.stats import SharedStoreStats
from kvtier.store.shared.store import KEY_PREFIX, SharedStore

__all__ = [
    "KEY_PREFIX",
    "ServerUrl",
    "SharedStore",
    "SharedStoreConfig",
    "SharedStoreStats",
    "parse_url",
]
