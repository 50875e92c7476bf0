"""The block record format: versioned header, payload checksum, namespace digest.

Engine-agnostic; imports neither vLLM nor torch.
"""

from kvtier.format.checksum import (
    ALGORITHMS,
    DEFAULT_ALGORITHM,
    ChecksumAlgorithm,
    compute_checksum,
)
from kvtier.format.namespace import Namespace
from kvtier.format.record import (
    FORMAT_VERSION,
    HEADER_BYTES,
    MAX_KEY_BYTES,
    RecordHeader,
    decode_header,
    encode_header,
    make_header,
    verify_payload,
)

__all__ = [
    "ALGORITHMS",
    "DEFAULT_ALGORITHM",
    "FORMAT_VERSION",
    "HEADER_BYTES",
    "MAX_KEY_BYTES",
    "ChecksumAlgorithm",
    "Namespace",
    "RecordHeader",
    "compute_checksum",
    "decode_header",
    "encode_header",
    "make_header",
    "verify_payload",
]
