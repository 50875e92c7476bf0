"""Small native helpers, compiled from C on first use and cached; Python fallbacks otherwise.

Nothing here is required: when there is no C compiler, the machine is not x86-64, or the build
fails, the caller gets ``None`` and keeps its pure-Python path (one warning in the log).
"""

from __future__ import annotations

import ctypes
import fcntl
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("streamcopy.c")
#: Signature of ``kvtier_copy_pages(n, dst, src, sizes) -> bytes copied`` (arrays of uint64).
PageCopier = Callable[[int, int, int, int], int]


def cache_dir() -> Path:
    root = os.environ.get("KVTIER_CACHE_DIR") or Path.home() / ".cache" / "kvtier"
    return Path(root) / "native"


@functools.cache
def page_copier() -> PageCopier | None:
    """``kvtier_copy_pages`` from the cached library (built if needed); None if impossible."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return None
    try:
        library = _build(_SOURCE)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = (getattr(exc, "stderr", None) or b"").decode(errors="replace")[-400:]
        log.warning("kvtier: no streaming page copy (%s %s); using memmove", exc, detail)
        return None
    if library is None:
        return None
    function = ctypes.CDLL(str(library)).kvtier_copy_pages  # CDLL calls release the GIL
    function.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    function.restype = ctypes.c_uint64
    return function


def _build(source: Path) -> Path | None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        log.warning("kvtier: no C compiler found; host pool copies use memmove (slower)")
        return None
    flags = ["-O2", "-shared", "-fPIC", "-fno-strict-aliasing"]
    digest = hashlib.sha256(source.read_bytes() + " ".join([compiler, *flags]).encode())
    folder = cache_dir()
    target = folder / f"{source.stem}-{digest.hexdigest()[:16]}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    # One build per library: the other processes of an engine wait for it and reuse it.
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if target.exists():
            return target
        fd, temp = tempfile.mkstemp(dir=folder, suffix=".so.tmp")
        os.close(fd)
        try:
            subprocess.run(
                [compiler, *flags, "-o", temp, str(source)],
                check=True,
                capture_output=True,
                timeout=120,
            )
            os.rename(temp, target)  # others only ever see a complete library
        finally:
            Path(temp).unlink(missing_ok=True)
    return target
