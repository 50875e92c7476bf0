"""Memory safety for the RAM-backed host pool: clamp it against live available memory.

The host pool is shared memory (``/dev/shm``) that vLLM's workers pre-fault in full at start-up,
so a pool larger than what the machine can spare does not fail cleanly: the kernel's OOM killer
picks a process later. kvtier clamps the pool before it is created, to

    budget = headroom - floor

* ``headroom``: the smaller of ``MemAvailable`` (``/proc/meminfo``) and the cgroup's
  ``limit - usage`` when a memory limit is set (containers: cgroup v2 ``memory.max`` /
  ``memory.current``, v1 ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``).
* ``floor``: RAM kept free for everything else, 10 % of total RAM (the machine's, or the
  cgroup limit when that is smaller), at least 256 MiB and at most 4 GiB. A fixed multi-GiB
  floor would zero the budget of a small CI runner; a pure percentage would waste GiBs on a
  large server.

No double counting: the clamp runs when the engine's KV cache and weights are already
allocated and resident (the worker's ``get_worker``), so ``MemAvailable`` already excludes them;
nothing is subtracted for them a second time.

Pure apart from ``read_memory``: the clamp itself takes a snapshot, so tests pass numbers.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kvtier.errors import ConfigError
from kvtier.units import format_size

FLOOR_FRACTION = 0.10
FLOOR_MIN_BYTES = 256 * 2**20
FLOOR_MAX_BYTES = 4 * 2**30
_UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a huge number


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """Memory as seen at one instant."""

    total_bytes: int
    #: MemAvailable: what can be allocated without swapping (page cache it may drop included).
    available_bytes: int
    #: Memory limit of our cgroup, or None when there is none.
    cgroup_limit_bytes: int | None = None
    cgroup_usage_bytes: int | None = None

    @property
    def headroom_bytes(self) -> int:
        headroom = self.available_bytes
        if self.cgroup_limit_bytes is not None and self.cgroup_usage_bytes is not None:
            headroom = min(headroom, max(self.cgroup_limit_bytes - self.cgroup_usage_bytes, 0))
        return headroom

    @property
    def effective_total_bytes(self) -> int:
        if self.cgroup_limit_bytes is not None:
            return min(self.total_bytes, self.cgroup_limit_bytes)
        return self.total_bytes

    def describe(self) -> str:
        text = (
            f"MemAvailable {format_size(self.available_bytes)} of {format_size(self.total_bytes)}"
        )
        if self.cgroup_limit_bytes is not None and self.cgroup_usage_bytes is not None:
            text += (
                f", cgroup limit {format_size(self.cgroup_limit_bytes)} with "
                f"{format_size(self.cgroup_usage_bytes)} used"
            )
        return text


def free_ram_floor(total_bytes: int) -> int:
    """RAM to leave free: 10 % of ``total_bytes``, within [256 MiB, 4 GiB]."""
    return int(min(max(total_bytes * FLOOR_FRACTION, FLOOR_MIN_BYTES), FLOOR_MAX_BYTES))


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


def _cgroup_memory(proc_self_cgroup: Path, cgroup_root: Path) -> tuple[int | None, int | None]:
    """(limit, usage) of our memory cgroup; the tightest limit on the path up to the root."""
    try:
        lines = proc_self_cgroup.read_text().splitlines()
    except OSError:
        return None, None
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, rel = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2
            folder = cgroup_root / rel.lstrip("/")
            usage = _read_int(folder / "memory.current")
            limit: int | None = None
            while True:
                value = _read_int(folder / "memory.max")
                if value is not None:
                    limit = value if limit is None else min(limit, value)
                if folder == cgroup_root or cgroup_root not in folder.parents:
                    break
                folder = folder.parent
            return limit, usage
        if "memory" in controllers.split(","):  # cgroup v1
            folder = cgroup_root / "memory" / rel.lstrip("/")
            if not folder.exists():
                folder = cgroup_root / "memory"
            return (
                _read_int(folder / "memory.limit_in_bytes"),
                _read_int(folder / "memory.usage_in_bytes"),
            )
    return None, None


def read_memory(
    meminfo: Path = Path("/proc/meminfo"),
    proc_self_cgroup: Path = Path("/proc/self/cgroup"),
    cgroup_root: Path = Path("/sys/fs/cgroup"),
) -> MemorySnapshot:
    """Read the live memory snapshot (Linux)."""
    fields: dict[str, int] = {}
    with open(meminfo, encoding="ascii") as f:
        for line in f:
            name, _, value = line.partition(":")
            parts = value.split()
            if parts:
                fields[name] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    limit, usage = _cgroup_memory(proc_self_cgroup, cgroup_root)
    if limit is None:
        usage = None
    return MemorySnapshot(fields["MemTotal"], fields["MemAvailable"], limit, usage)


@dataclass(frozen=True, slots=True)
class PoolClamp:
    """The host-pool size to use, and why."""

    pool_bytes: int
    rows: int
    clamped: bool
    #: One log line with the numbers behind the decision.
    message: str


def clamp_host_pool(
    requested_bytes: int,
    row_bytes: int,
    snapshot: MemorySnapshot,
    floor_bytes: int | None = None,
) -> PoolClamp:
    """Fit a RAM-backed host pool of ``requested_bytes`` into what the machine can spare.

    Raises ``ConfigError`` when not even one row fits. The result is a whole number of rows.
    """
    if floor_bytes is None:
        floor_bytes = free_ram_floor(snapshot.effective_total_bytes)
    requested_rows = requested_bytes // row_bytes
    budget = snapshot.headroom_bytes - floor_bytes
    basis = (
        f"{snapshot.describe()}; keeping {format_size(floor_bytes)} free "
        f"(floor: 10% of RAM, 256 MiB..4 GiB)"
    )
    if requested_rows * row_bytes <= budget:
        return PoolClamp(
            requested_rows * row_bytes,
            requested_rows,
            False,
            f"kvtier: host pool {format_size(requested_rows * row_bytes)} fits in RAM ({basis})",
        )
    rows = max(budget, 0) // row_bytes
    if rows == 0:
        raise ConfigError(
            f"kvtier: host pool: no RAM to spare for even one {format_size(row_bytes)} row "
            f"({basis}; host_pool={format_size(requested_bytes)}). Free memory, lower "
            "VLLM_CPU_KVCACHE_SPACE, or back the pool with a file on local disk: "
            "host_pool_dir='/path/on/local/disk' (--host-pool-dir)"
        )
    return PoolClamp(
        rows * row_bytes,
        rows,
        True,
        f"kvtier: host pool clamped from {format_size(requested_bytes)} to "
        f"{format_size(rows * row_bytes)} ({rows:,} rows) to fit in RAM ({basis}); "
        "for a larger pool use host_pool_dir (a sparse file on local disk)",
    )


def check_shm_space(pool_bytes: int, shm_dir: str = "/dev/shm") -> None:
    """Raise ``ConfigError`` when ``shm_dir`` cannot hold a pool of ``pool_bytes``."""
    try:
        st = os.statvfs(shm_dir)
    except OSError:
        return  # no /dev/shm to check; upstream's own check reports it
    free = st.f_bavail * st.f_frsize
    if pool_bytes > free:
        raise ConfigError(
            f"kvtier: host pool {format_size(pool_bytes)} does not fit in {shm_dir} "
            f"({format_size(free)} free). Enlarge {shm_dir} (docker: --shm-size or --ipc=host), "
            "give a smaller host_pool, or back the pool with a file on local disk: "
            "host_pool_dir='/path/on/local/disk' (--host-pool-dir)"
        )
