"""Byte sizes as people write them: ``64GiB``, ``512MiB``, ``1.5GB``, ``4096``."""

import re

from kvtier.errors import ConfigError

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: int | str, name: str = "size") -> int:
    """Parse a byte size; raise ``ConfigError`` naming ``name`` and a valid example."""
    if isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not a size; give bytes or a size such as '4GiB'")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{name}={value} is negative; give a size such as '4GiB'")
        return value
    match = _SIZE_RE.match(str(value))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ConfigError(
            f"{name}={value!r} is not a size; use a number with an optional unit "
            f"(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), such as '4GiB'"
        )
    return int(float(match.group(1)) * _UNITS[unit])


def format_size(num_bytes: float) -> str:
    """Binary-unit rendering, e.g. ``1.50 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(num_bytes) < 1024 or unit == "GiB":
            return f"{num_bytes:.0f} {unit}" if unit == "B" else f"{num_bytes:.2f} {unit}"
        num_bytes /= 1024
    raise AssertionError("unreachable")
