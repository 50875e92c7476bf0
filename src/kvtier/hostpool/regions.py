"""Host-pool region files in ``/dev/shm``: naming, and cleanup of those left by dead engines.

vLLM maps the host pool from ``/dev/shm/vllm_offload_<engine_id>.mmap``. On the tiering path
upstream unlinks it only in ``cleanup()``, which never runs when the engine is SIGKILLed, or when
the API server force-kills its EngineCore on SIGTERM; every such stop leaks the whole pool in
RAM. kvtier therefore (1) drops the file's name as soon as every process has mapped it (see
``KvtierCpuSpec.get_manager``), and (2) removes, at start-up, region files that no live process
holds open or mapped.
"""

import logging
import os
import time
from pathlib import Path

from kvtier.env import read_env

logger = logging.getLogger(__name__)

SHM_DIR = Path("/dev/shm")
REGION_GLOB = "vllm_offload_*.mmap*"


def region_path(engine_id: str) -> Path:
    """Path upstream's ``SharedOffloadRegion`` uses for an engine's host pool."""
    return SHM_DIR / f"vllm_offload_{engine_id}.mmap"


def _held_paths(folder: Path) -> set[str]:
    """Every path under ``folder`` that a visible process has open or mapped."""
    held: set[str] = set()
    prefix = str(folder) + "/"
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        fd_dir = f"/proc/{pid}/fd"
        try:
            for fd in os.listdir(fd_dir):
                try:
                    target = os.readlink(f"{fd_dir}/{fd}")
                except OSError:
                    continue
                if target.startswith(prefix):
                    held.add(target.removesuffix(" (deleted)"))
        except OSError:
            pass
        try:
            with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    idx = line.find(prefix)
                    if idx >= 0:
                        held.add(line[idx:].rstrip("\n").removesuffix(" (deleted)"))
        except OSError:
            pass
    return held


def clean_stale_regions(
    shm_dir: Path = SHM_DIR, min_age_s: float | None = None, pattern: str = REGION_GLOB
) -> list[Path]:
    """Remove region files that no live process holds; return the paths removed.

    A region some process has open or mapped is never touched, whoever owns it. File-system
    errors are logged, never raised: a failed cleanup must not stop an engine from starting
    (a bad ``KVTIER_SHM_MIN_AGE_S`` is a ``ConfigError``: it does). ``pattern``
    selects the files (the disk-backed pool uses its own, see ``kvtier.vllm.file_region``).
    """
    if min_age_s is None:
        # A region younger than this is never removed even if no holder is visible: its
        # creator may be in another PID namespace sharing /dev/shm, or between open() and our
        # /proc scan. ``KVTIER_SHM_MIN_AGE_S`` (default 30; tests use 0). Read here, not at
        # import, so a bad value is a ConfigError while the engine starts (kvtier.env).
        min_age_s = read_env().shm_min_age_s
    removed: list[Path] = []
    try:
        candidates = sorted(shm_dir.glob(pattern))
    except OSError as exc:
        logger.warning("kvtier: cannot list %s for stale host pools: %s", shm_dir, exc)
        return removed
    if not candidates:
        return removed
    held = _held_paths(shm_dir)
    now = time.time()
    for path in candidates:
        try:
            st = path.lstat()
        except FileNotFoundError:
            continue
        if str(path) in held or now - st.st_ctime < min_age_s:
            continue
        try:
            path.unlink()
        except OSError as exc:
            logger.warning("kvtier: could not remove stale host pool %s: %s", path, exc)
            continue
        removed.append(path)
        logger.warning(
            "kvtier: removed host pool %s (%.1f MiB) left by a dead engine",
            path,
            st.st_size / 2**20,
        )
    return removed
