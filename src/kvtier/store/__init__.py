"""Engine-agnostic block stores: the interface, an in-memory store and the disk store.

Imports neither vLLM nor torch (a test checks this in a fresh interpreter).
"""

from kvtier.store.base import BlockStore, Problem, StoreAbilities, StoreStats
from kvtier.store.disk.io import RecordIO, set_background_io_priority
from kvtier.store.disk.namespaces import NamespaceUsage, list_namespaces, remove_namespace
from kvtier.store.disk.root import auto_disk_capacity, check_root, effective_capacity
from kvtier.store.disk.store import DiskStore
from kvtier.store.memory_store import MemoryStore

__all__ = [
    "BlockStore",
    "DiskStore",
    "MemoryStore",
    "NamespaceUsage",
    "Problem",
    "RecordIO",
    "StoreAbilities",
    "StoreStats",
    "auto_disk_capacity",
    "check_root",
    "effective_capacity",
    "list_namespaces",
    "remove_namespace",
    "set_background_io_priority",
]
