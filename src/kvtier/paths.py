"""Where kvtier keeps files of its own: one answer for every caller."""

from pathlib import Path

from kvtier.env import read_env


def cache_dir() -> Path:
    """Root of kvtier's caches: ``$KVTIER_CACHE_DIR``, or ``~/.cache/kvtier`` when it is unset.

    An empty ``KVTIER_CACHE_DIR`` counts as unset (``VAR= cmd`` is how shells clear a
    variable); it never means the current folder.
    """
    return read_env().cache_dir or Path.home() / ".cache" / "kvtier"
