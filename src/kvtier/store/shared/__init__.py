"""The shared tier: a ``BlockStore`` on Redis/Valkey (standalone or Cluster), verified.

Importing this package imports redis-py (the ``shared`` extra; without it the import raises
``MissingExtraError`` naming the extra); ``kvtier.store`` does not import it, so the disk and
memory tiers work without the client installed. The store's configuration is
``kvtier.settings.SharedTierSettings`` (the same model the vLLM tier parses) and its URL
forms are ``kvtier.shared_url``'s.
"""

from kvtier.extras import require

# Before the first redis import: without the extra, opening the tier (the engine's start-up
# check) refuses with the extra to install instead of a ModuleNotFoundError from redis-py.
require("shared", "the shared tier")

from kvtier.settings import SharedTierSettings  # noqa: E402
from kvtier.shared_url import ServerUrl, parse_url  # noqa: E402
from kvtier.store.shared.stats import SharedStoreStats  # noqa: E402
from kvtier.store.shared.store import KEY_PREFIX, SharedStore  # noqa: E402

__all__ = [
    "KEY_PREFIX",
    "ServerUrl",
    "SharedStore",
    "SharedStoreStats",
    "SharedTierSettings",
    "parse_url",
]
