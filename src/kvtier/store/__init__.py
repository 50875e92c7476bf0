"""Engine-agnostic block stores: the interface, an in-memory store and the disk store.

Imports neither vLLM nor torch (a test checks this in a fresh interpreter).
"""

from kvtier.store._pending import check_root, effective_capacity  # noqa: F401  (merge)
from kvtier.store.base import BlockStore, Problem, StoreStats
from kvtier.store.disk import DiskStore
from kvtier.store.io import RecordIO, set_background_io_priority
from kvtier.store.memory import MemoryStore
from kvtier.store.namespaces import NamespaceUsage, list_namespaces, remove_namespace

__all__ = [
    "BlockStore",
    "DiskStore",
    "MemoryStore",
    "NamespaceUsage",
    "Problem",
    "RecordIO",
    "StoreStats",
    "list_namespaces",
    "remove_namespace",
    "set_background_io_priority",
]
