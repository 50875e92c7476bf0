"""Sealed records: AES-256-GCM payloads, per-tenant keys and names that reveal no block key.

Keys, from the top:

* A **master key** (32 bytes, the operator's) has a public **key id**, the first 8 bytes of
  HMAC-SHA256(master, "kvtier key id v1"), written in every record it seals so a reader knows
  which of its keys opens the record (and ``kvtier gc`` which records only a retired key reads).
* A **tenant** (a request's ``cache_salt``, or the default tenant for requests without one)
  has two keys per master key, from HKDF-SHA256(master, info = the tenant's label): a data key
  and a name key. Tenants never share either.
* A record's **name** (the disk file name, the server key, the header's ``key`` field) is
  HMAC-SHA256(name key, namespace digest || block key) truncated to 16 bytes: without the key a
  folder listing or a SCAN shows no block hash and gives no way to test whether a prompt was
  cached. 128 bits keep names collision-free far beyond any cache's size (the birthday bound is
  2^64 records).
* A record's **AES key** is HMAC-SHA256(data key, "record" || a random 16-byte salt in its
  header), with a random 12-byte nonce. Rejected: one GCM key per tenant with random nonces,
  which NIST caps at 2^32 records per key (a busy engine writes that in days); a fresh key per
  record has no such limit, for one HMAC and one key schedule per record (microseconds against
  the megabyte payload).

Associated data. GCM authenticates, besides the ciphertext: the namespace digest, the record's
name and every header field but the payload checksum and the tag (version, flags, checksum id,
payload length, key id, salt). The name is a MAC of the namespace and the block key under the
tenant's key, so binding the name binds the block key and the tenant too, and lets ``verify``
authenticate a record from its header alone, where the block key is not known. A record moved
to another name or namespace, swapped with another, written under another tenant's key, or
with a flipped byte anywhere fails the tag (reason ``auth``), before a byte is served; one under
a key id the reader does not hold fails as ``key_id``. What the tag cannot tell: a record
replaced by an older record of the same block, tenant and key (the same KV, so nothing wrong is
served).

The payload checksum covers the ciphertext (see kvtier.format.record for why). Loads with the
key skip it: the tag already authenticates every ciphertext bit, and a second pass over the
payload would cost a quarter of the decryption's time.

Engine-agnostic: no vLLM, no torch; ``cryptography`` is imported when a key ring is built (the
``encryption`` extra).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import hmac
import mmap
import os
import struct
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from kvtier import extras
from kvtier.errors import ConfigError, CorruptRecordError
from kvtier.format import checksum as _checksum
from kvtier.format.namespace import Namespace
from kvtier.format.record import (
    FLAG_SEALED,
    FORMAT_VERSION,
    KEY_ID_BYTES,
    NONCE_BYTES,
    SALT_BYTES,
    RecordHeader,
    Seal,
    check_key,
    verify_stored_bytes,
)

#: Bytes of a master key (AES-256).
MASTER_KEY_BYTES = 32
#: Bytes of a record's name: a truncated HMAC-SHA256 (see the module docstring).
NAME_BYTES = 16
_DOMAIN = b"kvtier sealed record v1\x00"
_KEY_ID_INFO = b"kvtier key id v1"
_HKDF_SALT = b"kvtier tenant keys v1"
_AD_FIXED = struct.Struct("<HBBQ")
_U16 = struct.Struct("<H")
_PAGE = mmap.PAGESIZE
#: Tenants whose keys a ``KeyRing`` keeps derived (least recently used dropped first).
TENANTS_KEPT = 4096
#: ``Namespace.extra`` entry of a namespace whose records are sealed.
NAMESPACE_MARK = ("encryption", "aes-256-gcm/v1")


def sealed_namespace(namespace: Namespace) -> Namespace:
    """``namespace`` marked as holding sealed records: another digest, so sealed and plain
    records of one model never share a folder or a server prefix (no reader meets a record
    of the other kind, and ``kvtier ls`` tells an encrypted namespace from its
    ``namespace.json``)."""
    key, value = NAMESPACE_MARK
    if namespace.extra.get(key) == value:
        return namespace
    return dataclasses.replace(namespace, extra={**namespace.extra, key: value})


def is_sealed_namespace(namespace: Namespace) -> bool:
    key, value = NAMESPACE_MARK
    return namespace.extra.get(key) == value


def tenant_label(cache_salt: str | None) -> bytes:
    """HKDF info of a tenant: the default tenant and every salt get distinct labels (an empty
    salt is a tenant of its own, not the default)."""
    if cache_salt is None:
        return b"kvtier tenant default"
    return b"kvtier tenant salt:" + cache_salt.encode("utf-8")


class MasterKey:
    """One master key; its ``repr`` and ``str`` show the key id only, never the secret."""

    __slots__ = ("_secret", "key_id")

    def __init__(self, secret: bytes) -> None:
        if not isinstance(secret, bytes) or len(secret) != MASTER_KEY_BYTES:
            # Never echo the value: it may be a key of the wrong length.
            raise ConfigError(
                f"encryption: a master key must be {MASTER_KEY_BYTES} bytes; "
                "make one with `openssl rand -hex 32`"
            )
        self._secret = secret
        #: Public identifier written into every record this key seals.
        self.key_id = hmac.digest(secret, _KEY_ID_INFO, "sha256")[:KEY_ID_BYTES]

    def __repr__(self) -> str:
        return f"MasterKey(key_id={self.key_id.hex()})"

    __str__ = __repr__

    def __reduce__(self) -> Any:
        raise TypeError("a MasterKey is not pickled: load it from its file in each process")


class _TenantKeys:
    """The data and name keys of one tenant under one master key."""

    __slots__ = ("data_key", "key_id", "name_key")

    def __init__(self, master: MasterKey, label: bytes) -> None:
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.kdf.hkdf import HKDF

        okm = HKDF(hashes.SHA256(), 64, _HKDF_SALT, label).derive(master._secret)
        self.key_id = master.key_id
        self.data_key = okm[:32]
        self.name_key = okm[32:]

    def __repr__(self) -> str:
        return f"_TenantKeys(key_id={self.key_id.hex()})"


class KeyRing:
    """The master keys of a deployment: the first seals new records, all of them open records.

    Rotation: put a new key first and keep the old ones after it; records under an old key are
    still read (and found: lookups try each key's name), new ones are written under the new
    key; once the old records are gone (evicted, or ``kvtier gc --retired-keys``) drop the old
    key. Thread-safe; holds no secret in its ``repr``.
    """

    def __init__(self, keys: Sequence[MasterKey]) -> None:
        extras.require("encryption", "encryption at rest")
        if not keys:
            raise ConfigError("encryption: no master key; give at least one key")
        ids = [k.key_id for k in keys]
        if len(set(ids)) != len(ids):
            raise ConfigError("encryption: the same master key is given twice; give each once")
        self.keys = tuple(keys)
        self._lock = threading.Lock()
        self._tenants: OrderedDict[bytes, RecordSealer] = OrderedDict()

    @property
    def write_key_id(self) -> bytes:
        """Key id new records are sealed under."""
        return self.keys[0].key_id

    @property
    def key_ids(self) -> tuple[bytes, ...]:
        return tuple(k.key_id for k in self.keys)

    def tenant(self, cache_salt: str | None = None) -> RecordSealer:
        """The sealer of a tenant (``None``: the default tenant). The ``TENANTS_KEPT`` most
        recently used are kept; another is derived again (one HKDF per master key), and seals
        and opens exactly as before."""
        label = tenant_label(cache_salt)
        with self._lock:
            sealer = self._tenants.get(label)
            if sealer is not None:
                self._tenants.move_to_end(label)
                return sealer
        sealer = RecordSealer(tuple(_TenantKeys(k, label) for k in self.keys))
        with self._lock:
            sealer = self._tenants.setdefault(label, sealer)
            if len(self._tenants) > TENANTS_KEPT:
                self._tenants.popitem(last=False)
            return sealer

    def __repr__(self) -> str:
        return f"KeyRing(key_ids={[i.hex() for i in self.key_ids]})"


class RecordSealer:
    """Seals and opens the records of one tenant (``KeyRing.tenant``); thread-safe.

    Stores call it with the block key and use ``names`` for everything they keep: the block
    key itself is never written anywhere.
    """

    def __init__(self, keys: tuple[_TenantKeys, ...]) -> None:
        self._keys = keys
        self._by_id = {k.key_id: k for k in keys}

    def name(self, namespace_digest: bytes, block_key: bytes) -> bytes:
        """The stored name of ``block_key`` under the write key."""
        return _name(self._keys[0], namespace_digest, block_key)

    def names(self, namespace_digest: bytes, block_key: bytes) -> list[bytes]:
        """The names ``block_key`` may be stored under: the write key's first, then each
        older key's (records written before a rotation)."""
        check_key(block_key)
        return [_name(k, namespace_digest, block_key) for k in self._keys]

    def seal(
        self, namespace_digest: bytes, name: bytes, payload: _checksum.Buffer
    ) -> tuple[RecordHeader, memoryview]:
        """Encrypt ``payload`` as the record stored under ``name`` (``name(...)`` of its block
        key); return its header and the ciphertext.

        The ciphertext lies in a page-aligned buffer of the calling thread, shared by every
        tenant's sealer and valid until the thread's next ``seal`` (so an ``O_DIRECT`` write
        still applies): one buffer per thread however many tenants it seals for. One pass
        over the payload, then one checksum pass over the ciphertext.
        """
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        view = memoryview(payload).cast("B")
        keys = self._keys[0]
        salt, nonce = os.urandom(SALT_BYTES), os.urandom(NONCE_BYTES)
        out = _thread_buffer(view.nbytes)
        encryptor = Cipher(algorithms.AES(_record_key(keys, salt)), modes.GCM(nonce)).encryptor()
        alg = _checksum.DEFAULT_ALGORITHM.algorithm_id
        encryptor.authenticate_additional_data(
            _associated_data(namespace_digest, name, alg, view.nbytes, keys.key_id, salt)
        )
        encryptor.update_into(view, out)
        encryptor.finalize()
        header = RecordHeader(
            namespace_digest=namespace_digest,
            key=name,
            payload_len=view.nbytes,
            payload_checksum=_checksum.compute_checksum(out, alg),
            checksum_alg=alg,
            seal=Seal(keys.key_id, salt, nonce, encryptor.tag),
        )
        return header, out

    def open(self, header: RecordHeader, ciphertext: _checksum.Buffer, out: memoryview) -> None:
        """Authenticate and decrypt a record whose header ``decode_header`` accepted.

        ``ciphertext`` may be ``out`` itself (decrypted in place). Raises
        ``CorruptRecordError``: ``not_sealed`` (a plain record where this tenant's records are
        sealed), ``key_id`` (a key this ring does not hold), ``length``, ``auth`` (the tag
        failed: tampered, moved, swapped or another tenant's); ``out`` then holds unverified
        bytes, which the caller must not serve.
        """
        from cryptography.exceptions import InvalidTag
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        seal = header.seal
        if seal is None:
            raise CorruptRecordError("not_sealed", "a plain record where records are encrypted")
        keys = self._by_id.get(seal.key_id)
        if keys is None:
            raise CorruptRecordError(
                "key_id", f"sealed under key {seal.key_id.hex()}, which is not configured"
            )
        source = memoryview(ciphertext).cast("B")
        out = memoryview(out).cast("B")  # a typed row (floats) is opened as bytes
        if source.nbytes != header.payload_len or out.nbytes != header.payload_len:
            raise CorruptRecordError(
                "length", f"payload {source.nbytes} bytes, header says {header.payload_len}"
            )
        decryptor = Cipher(
            algorithms.AES(_record_key(keys, seal.salt)), modes.GCM(seal.nonce, seal.tag)
        ).decryptor()
        decryptor.authenticate_additional_data(
            _associated_data(
                header.namespace_digest,
                header.key,
                header.checksum_alg,
                header.payload_len,
                seal.key_id,
                seal.salt,
                header.version,
            )
        )
        decryptor.update_into(source, out)
        try:
            decryptor.finalize()
        except InvalidTag:
            raise CorruptRecordError(
                "auth", "the record does not authenticate under its name, namespace and key"
            ) from None

    def verify(self, header: RecordHeader, ciphertext: _checksum.Buffer) -> None:
        """``open`` into scratch memory: the full check, for ``verify`` (slow path)."""
        verify_stored_bytes(header, ciphertext)
        self.open(header, ciphertext, memoryview(bytearray(header.payload_len)))

    def __repr__(self) -> str:
        return f"RecordSealer(key_ids={[k.key_id.hex() for k in self._keys]})"


_local = threading.local()


def _thread_buffer(nbytes: int) -> memoryview:
    """The calling thread's ciphertext buffer, at least ``nbytes`` (page-aligned)."""
    buf: mmap.mmap | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < nbytes:
        if buf is not None:
            # A view of this thread's previous ciphertext may still be alive: then the
            # mapping is left to be unmapped when that view goes (closing it would fail).
            with contextlib.suppress(BufferError):
                buf.close()
        buf = mmap.mmap(-1, max(_PAGE, -(-nbytes // _PAGE) * _PAGE))
        _local.buf = buf
    return memoryview(buf)[:nbytes]


def _name(keys: _TenantKeys, namespace_digest: bytes, block_key: bytes) -> bytes:
    return hmac.digest(keys.name_key, namespace_digest + block_key, "sha256")[:NAME_BYTES]


def _record_key(keys: _TenantKeys, salt: bytes) -> bytes:
    return hmac.digest(keys.data_key, b"record" + salt, hashlib.sha256)


def _associated_data(
    namespace_digest: bytes,
    name: bytes,
    checksum_alg: int,
    payload_len: int,
    key_id: bytes,
    salt: bytes,
    version: int = FORMAT_VERSION,
) -> bytes:
    return b"".join(
        (
            _DOMAIN,
            namespace_digest,
            _U16.pack(len(name)),
            name,
            _AD_FIXED.pack(version, FLAG_SEALED, checksum_alg, payload_len),
            key_id,
            salt,
        )
    )
