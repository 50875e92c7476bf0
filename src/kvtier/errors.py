"""kvtier's exception hierarchy.

A message says what went wrong, the offending value and the fix. A cache miss is never an
exception: lookups and loads return ``None``/``False`` for it.
"""


class KvtierError(Exception):
    """Root of every error kvtier raises on purpose."""


class ConfigError(KvtierError, ValueError):
    """A configuration value is invalid; the message names the key and the fix."""


class CorruptRecordError(KvtierError):
    """A stored record failed a check (header, length, namespace, key or checksum)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        #: Short machine-readable reason, also used in quarantine file names.
        self.reason = reason
