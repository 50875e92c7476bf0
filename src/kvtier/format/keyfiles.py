"""Master keys of encryption at rest: read from private files or from ``KVTIER_MASTER_KEY``.

Read in the engine's processes when kvtier's spec or a tier starts, once by each (a spec hands
its tiers what it read: ``TierKeyRings``), and by the operator commands; never at import and
never carried in vLLM's config: the settings name files (or the variable), not keys.

A key file is refused unless it is a regular file (not a symlink), owned by the user running
the engine and readable by nobody else (mode 0600 or 0400): a key others can read protects
nothing, and one others can write lets them choose it. Refusals name the file, what is wrong
and the fix; no message, log line or ``repr`` carries a key, and a key of the wrong form is
described, never echoed.

Forms: 32 raw bytes, or 64 hex digits (surrounding whitespace ignored), as ``openssl rand 32``
or ``openssl rand -hex 32`` print them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path

from kvtier.env import read_env
from kvtier.errors import ConfigError
from kvtier.format.sealing import MASTER_KEY_BYTES, KeyRing, MasterKey
from kvtier.settings import (
    MASTER_KEY_VARIABLE,
    DiskTierSettings,
    EncryptionSettings,
    SharedTierSettings,
)

#: Largest key file read (a key is at most 64 hex digits and a newline).
_MAX_FILE_BYTES = 4096
_FILE_OPTION = "encryption_key_files (--encryption-key-file)"


def load_keyring(settings: EncryptionSettings, environ: Mapping[str, str] | None = None) -> KeyRing:
    """The key ring ``settings`` point at; raises ``ConfigError`` naming the option and fix."""
    if settings.key_env:
        value = read_env(environ).master_key
        if value is None:
            raise ConfigError(
                f"kvtier: encryption_key_env is on but {MASTER_KEY_VARIABLE} is not set in the "
                "engine's environment; export it (64 hex digits per key, comma-separated) or "
                "give encryption_key_files"
            )
        parts = [p.strip() for p in value.get_secret_value().split(",")]
        keys = [
            _parse_key(p.encode(), f"{MASTER_KEY_VARIABLE} (key {i + 1})")
            for i, p in enumerate(parts)
        ]
    else:
        keys = [read_key_file(path) for path in settings.key_files]
    return KeyRing(keys)


class TierKeyRings:
    """The key rings of an engine's tiers, each read from its files once.

    One per engine, passed down rather than kept in a global: kvtier's spec reads its tiers'
    keys while it checks their options (``kvtier.vllm.engine_context.start_options``, so a
    bad key file refuses the start before any pool exists) and hands them, through the
    engine's context, to the tiers it builds; a tier under a stock spec has a context, and so
    key rings, of its own. Tiers with the same encryption settings share one ring. Used on the
    thread that builds the spec and its tiers; not thread-safe.
    """

    def __init__(self) -> None:
        self._rings: dict[EncryptionSettings, KeyRing] = {}

    def for_tier(self, settings: DiskTierSettings | SharedTierSettings | None) -> KeyRing | None:
        """The key ring of a tier's encryption settings (None for a plain tier or one that is
        not kvtier's), read on the first call; raises ``ConfigError`` naming the option and
        the fix."""
        if settings is None or settings.encryption is None:
            return None
        ring = self._rings.get(settings.encryption)
        if ring is None:
            ring = load_keyring(settings.encryption)
            self._rings[settings.encryption] = ring
        return ring


def read_key_file(path: Path) -> MasterKey:
    """One master key from a private file (see the module docstring)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ConfigError(
            f"kvtier: {_FILE_OPTION}: {path} does not exist; give the file of a master key"
        ) from None
    except OSError as exc:
        if os.path.islink(path):
            raise ConfigError(
                f"kvtier: {_FILE_OPTION}: {path} is a symlink; give the key file itself"
            ) from None
        raise ConfigError(
            f"kvtier: {_FILE_OPTION}: cannot open {path} ({exc.strerror}); give a file the "
            "engine's user can read"
        ) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(
                f"kvtier: {_FILE_OPTION}: {path} is not a regular file; give the key file"
            )
        if st.st_uid != os.geteuid():
            raise ConfigError(
                f"kvtier: {_FILE_OPTION}: {path} belongs to uid {st.st_uid}, not to the "
                f"engine's user ({os.geteuid()}); run `chown {os.geteuid()} {path}`"
            )
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"kvtier: {_FILE_OPTION}: {path} has mode {stat.S_IMODE(st.st_mode):#o}, "
                f"open to group or others; run `chmod 600 {path}`"
            )
        data = os.read(fd, _MAX_FILE_BYTES + 1)
    finally:
        os.close(fd)
    return _parse_key(data, f"{_FILE_OPTION}: {path}")


def _parse_key(data: bytes, where: str) -> MasterKey:
    if len(data) == MASTER_KEY_BYTES:
        return MasterKey(data)
    text = data.strip()
    if len(text) == 2 * MASTER_KEY_BYTES:
        try:
            return MasterKey(bytes.fromhex(text.decode("ascii")))
        except (UnicodeDecodeError, ValueError):
            pass
    # The value is described by its length only: it may be a key in the wrong form.
    raise ConfigError(
        f"kvtier: {where} holds {len(data)} bytes that are neither {MASTER_KEY_BYTES} raw bytes "
        f"nor {2 * MASTER_KEY_BYTES} hex digits; make a key with `openssl rand -hex 32`"
    )
