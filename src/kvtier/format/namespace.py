"""The namespace: everything that must match for a stored block to be valid KV.

Two engines may share stored blocks only if they run the same model with the same weights,
lay KV out the same way, hash prefixes with the same algorithm and write the same record
format. All of that goes into ``Namespace``; its ``digest()`` names the store's folder and is
written into every record header, so a record is never served to another namespace, even
when a file is copied across folders.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kvtier.errors import ConfigError
from kvtier.format.record import FORMAT_VERSION, NAMESPACE_DIGEST_BYTES


@dataclass(frozen=True)
class Namespace:
    """Identity of a model + KV layout; records of different namespaces never mix.

    Hashable and comparable; ``extra`` is copied into a read-only mapping at construction.
    """

    #: Model name or path as the engine was given it, e.g. "HuggingFaceTB/SmolLM2-135M".
    model: str
    #: Fingerprint of the weights (e.g. a digest of the weight files); "" if unknown.
    weights_fingerprint: str
    #: KV cache element type, e.g. "float32", "bfloat16".
    kv_dtype: str
    #: Tokens per block.
    block_size_tokens: int
    #: KV cache groups (1 for plain attention models; more for hybrid models).
    num_groups: int
    #: Attention layers whose KV one block holds.
    num_layers: int
    #: KV heads per layer.
    num_kv_heads: int
    #: Elements per head.
    head_size: int
    #: Payload bytes of one block record.
    block_bytes: int
    #: Prefix hash algorithm that produced the keys, e.g. "sha256_cbor".
    hash_algorithm: str
    #: Record format version (kvtier.format.record.FORMAT_VERSION).
    format_version: int = FORMAT_VERSION
    #: Anything else that changes the meaning of stored KV (engine version, dtype of scales...).
    extra: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "str" and not isinstance(value, str):
                raise ConfigError(f"namespace: {f.name}={value!r} must be a string")
            if f.type == "int" and (not isinstance(value, int) or isinstance(value, bool)):
                raise ConfigError(f"namespace: {f.name}={value!r} must be an integer")
            if f.type == "int" and value < 0:
                raise ConfigError(f"namespace: {f.name}={value} must not be negative")
        if self.block_bytes <= 0:
            raise ConfigError(f"namespace: block_bytes={self.block_bytes}; give the payload size")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.extra.items()):
            raise ConfigError(f"namespace: extra={dict(self.extra)!r} must map str to str")
        object.__setattr__(self, "extra", MappingProxyType(dict(sorted(self.extra.items()))))

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (``extra`` as a dict), the input of ``digest`` and ``to_json``."""
        data = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        data["extra"] = dict(self.extra)
        return data

    def digest(self) -> bytes:
        """16-byte sha256 of the canonical JSON form; stable across runs and Python versions."""
        canonical = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode("ascii")).digest()[:NAMESPACE_DIGEST_BYTES]

    def digest_hex(self) -> str:
        """``digest()`` as 32 hex characters: the name of the namespace's folder."""
        return self.digest().hex()

    def to_json(self) -> str:
        """Human-readable JSON, written as ``namespace.json`` beside the data."""
        return json.dumps({**self.to_dict(), "digest": self.digest_hex()}, indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Namespace:
        """Inverse of ``to_json``; raises ``ConfigError`` on unknown or missing fields."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"namespace: not valid JSON ({exc})") from None
        if not isinstance(data, dict):
            raise ConfigError("namespace: JSON must be an object")
        stored_digest = data.pop("digest", None)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"namespace: unknown fields {unknown}; known: {sorted(known)}")
        try:
            namespace = cls(**data)
        except TypeError as exc:
            raise ConfigError(f"namespace: {exc}") from None
        if stored_digest is not None and stored_digest != namespace.digest_hex():
            raise ConfigError(
                f"namespace: stored digest {stored_digest} does not match its fields "
                f"({namespace.digest_hex()}); the file was edited or written by another version"
            )
        return namespace
