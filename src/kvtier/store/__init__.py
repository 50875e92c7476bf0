"""Engine-agnostic block stores: the interface, an in-memory store and the disk store.

Imports neither vLLM nor torch (a test checks this in a fresh interpreter).
"""

from kvtier.store.base import (
    BlockStore,
    FixedClaim,
    LoadClaim,
    Problem,
    StoreAbilities,
    StoreStats,
)
from kvtier.store.disk.io import set_background_io_priority
from kvtier.store.disk.namespaces import NamespaceUsage, list_namespaces, remove_namespace
from kvtier.store.disk.reader import NativeRecordReader, RecordReader, default_reader
from kvtier.store.disk.record_io import RecordIO
from kvtier.store.disk.root import auto_disk_capacity, check_root, effective_capacity
from kvtier.store.disk.store import DiskStore
from kvtier.store.disk.writer import RecordWriter
from kvtier.store.memory_store import MemoryStore

__all__ = [
    "BlockStore",
    "DiskStore",
    "FixedClaim",
    "LoadClaim",
    "MemoryStore",
    "NamespaceUsage",
    "NativeRecordReader",
    "Problem",
    "RecordIO",
    "RecordReader",
    "RecordWriter",
    "StoreAbilities",
    "StoreStats",
    "auto_disk_capacity",
    "check_root",
    "default_reader",
    "effective_capacity",
    "list_namespaces",
    "remove_namespace",
    "set_background_io_priority",
]
