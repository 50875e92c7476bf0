"""Helpers shared by the store tests (tests is a package: import as tests.support.store)."""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterable
from pathlib import Path

from kvtier.format import HEADER_BYTES, Namespace
from kvtier.format.sealing import RecordSealer
from kvtier.store.disk.root import INDEX_ALLOWANCE_BYTES

PAYLOAD_BYTES = 8192


def disk_capacity(records: int, payload_bytes: int = PAYLOAD_BYTES) -> int:
    """A disk cap that holds exactly ``records`` records of ``payload_bytes`` (a multiple of
    4 KiB) besides the index files' allowance."""
    return INDEX_ALLOWANCE_BYTES + records * (HEADER_BYTES + payload_bytes)


def make_namespace(model: str = "test/model", block_bytes: int = PAYLOAD_BYTES) -> Namespace:
    """A small namespace; ``model`` varies it."""
    return Namespace(
        model=model,
        weights_fingerprint="sha256:feed",
        kv_dtype="float32",
        block_size_tokens=16,
        num_groups=1,
        num_layers=2,
        num_kv_heads=2,
        head_size=64,
        block_bytes=block_bytes,
        hash_algorithm="sha256_cbor",
    )


def key_of(i: int) -> bytes:
    """A vLLM-shaped key: 32-byte hash + 4-byte big-endian group index."""
    return i.to_bytes(32, "big") + (0).to_bytes(4, "big")


def payload_of(i: int, size: int = PAYLOAD_BYTES) -> bytes:
    """Deterministic, key-specific payload bytes."""
    return (i.to_bytes(4, "big") * (size // 4 + 1))[:size]


def aligned_buffer(size: int) -> memoryview:
    """A page-aligned writable buffer, like a host-pool row."""
    return memoryview(mmap.mmap(-1, size))


def files_under(folder: Path) -> list[Path]:
    """Every non-directory entry below ``folder``."""
    return [Path(d) / f for d, _, names in os.walk(folder) for f in names]


def charged_bytes(folder: Path) -> int:
    """What the disk store charges for everything below ``folder`` (each entry's size,
    folders included, rounded up to 4 KiB), as kvtier.store.disk.quarantine counts an entry."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            size = os.lstat(os.path.join(dirpath, name)).st_size
            total += -(-size // 4096) * 4096
    return total


#: Block keys ``disk_ground_truth`` recognises by name in a sealed folder (the tests' keys).
SEALED_KEYS_TRIED = 4096


def disk_ground_truth(
    namespace_dir: Path,
    namespace: Namespace,
    sealer: RecordSealer | None = None,
    block_keys: Iterable[bytes] | None = None,
) -> dict[bytes, bytes]:
    """The records under a disk store's namespace folder, decoded from the files with
    kvtier.format alone (no store, no index): key -> payload. Where several files hold one
    key (an older version not unlinked yet, or a record under each key of a rotated key
    ring), the newest record id wins. A file that does not decode is an AssertionError: a
    store must never leave one in ``blocks/``. With ``sealer`` the files are named by keyed
    MACs: each is opened with it, and its block key found among ``block_keys`` (default:
    ``key_of(i)`` for i below SEALED_KEYS_TRIED) under any of the sealer's keys."""
    from kvtier.format.record import decode_header, verify_payload

    by_name = {}
    if sealer is not None:
        digest = namespace.digest()
        tried = block_keys if block_keys is not None else map(key_of, range(SEALED_KEYS_TRIED))
        by_name = {name: key for key in tried for name in sealer.names(digest, key)}
    found: dict[bytes, tuple[int, bytes]] = {}
    for path in sorted((namespace_dir / "blocks").glob("*/*.kvb")):
        key_hex, record_id, _ = path.name.split(".")
        key = bytes.fromhex(key_hex)
        data = path.read_bytes()
        header = decode_header(data[:HEADER_BYTES], namespace.digest(), key)
        payload = data[HEADER_BYTES:]
        assert header.payload_len == len(payload), f"{path.name}: torn record"
        if sealer is None:
            verify_payload(header, payload)
        else:
            out = memoryview(bytearray(len(payload)))
            sealer.open(header, payload, out)
            payload = bytes(out)
            key = by_name[key]
        if key not in found or found[key][0] < int(record_id):
            found[key] = (int(record_id), payload)
    return {key: payload for key, (_, payload) in found.items()}
