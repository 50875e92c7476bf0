"""A slow or stalled disk with no privileges: the disk tier's reads slowed through its reader.

The unprivileged twin of the slow disk (``tests/support/slow_disk.py``, which needs root, loop
devices and cgroup v1 blkio). A real engine loads ``ThrottledDiskTier`` by ``module_path``: the
stock disk tier whose ``DiskStore`` reads through ``ThrottledReader``, which, before each record
read, waits as long as the record takes at the rate the test process last wrote into a control
file (``ThrottledDisk.throttle``). The rate is re-read while waiting, as a blkio throttle applies
at once to queued reads: a stall (a few KB/s) ends when it is lifted. The bytes read so far are
written beside the control file, so the test sees that the engine's reads went through it.

What it does not model: the kernel's I/O path under the throttle (O_DIRECT bios queued in the
block layer); the slow disk covers that where the host allows it.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

from kvtier.bench.harness import EngineConfig
from kvtier.format import HEADER_BYTES, Namespace
from kvtier.settings import DiskTierSettings
from kvtier.store import DiskStore, RecordIO, RecordReader, RecordWriter
from kvtier.vllm.disk_tier import KvtierDiskTier

#: Environment variable naming the control file, in the engine's process.
CONTROL_ENV = "KVTIER_TEST_THROTTLE_FILE"
REPO_ROOT = Path(__file__).resolve().parents[2]
#: How often a waiting read looks at the control file again.
POLL_S = 0.05


def _rate(control: Path) -> int | None:
    """The read limit in force, bytes/s (None: full speed)."""
    try:
        text = control.read_text().strip()
    except FileNotFoundError:
        return None
    return int(text) if text else None


class ThrottledReader(RecordReader):
    """The Python steps' reader (the native reader's one call cannot be slowed from Python),
    each read taking at least its size over the control file's rate."""

    def __init__(self, control: Path) -> None:
        super().__init__()
        self.control = control
        self._lock = threading.Lock()
        self._bytes_read = 0

    def read_into(self, path: Path, out: memoryview) -> memoryview:
        self._wait(HEADER_BYTES + out.nbytes)
        header = super().read_into(path, out)
        with self._lock:
            self._bytes_read += HEADER_BYTES + out.nbytes
            # Written whole and renamed, so the test process never reads half a number.
            partial = self.control.with_suffix(".read.partial")
            partial.write_text(str(self._bytes_read))
            os.replace(partial, self.control.with_suffix(".read"))
        return header

    def _wait(self, nbytes: int) -> None:
        """Let ``nbytes`` through at the current rate, re-read every ``POLL_S``."""
        owed = float(nbytes)
        last = time.monotonic()
        while (rate := _rate(self.control)) is not None:
            now = time.monotonic()
            owed -= rate * (now - last)
            last = now
            if owed <= 0:
                return
            time.sleep(min(POLL_S, owed / rate))


def _throttled_store(settings: DiskTierSettings, namespace: Namespace) -> DiskStore:
    """``open_disk_store`` of the stock tier (local disk only), reading through
    ``ThrottledReader``."""
    return DiskStore(
        settings.root_dir,
        namespace,
        settings.capacity_bytes,
        free_space_floor_bytes=settings.free_space_floor_bytes,
        fsync=settings.fsync,
        io=RecordIO(RecordWriter(settings.fsync), ThrottledReader(Path(os.environ[CONTROL_ENV]))),
    )


class ThrottledDiskTier(KvtierDiskTier):
    """The stock disk tier, its store's reads throttled by the test (engine process side)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, store_factory=_throttled_store, **kwargs)


@dataclasses.dataclass
class ThrottledDisk:
    """Test-process side: the folder to put the tier in, and the throttle of its reads."""

    #: Folder for the disk tier (as ``SlowDisk.mount``).
    mount: Path
    #: Read limit now in force, bytes/s (None: unthrottled).
    read_bps: int | None = None

    @property
    def control(self) -> Path:
        return self.mount / "throttle"

    def throttle(self, read_bps: int | None) -> None:
        """Limit the engine's record reads to ``read_bps`` bytes/s (None: lift)."""
        partial = self.control.with_suffix(".partial")
        partial.write_text("" if read_bps is None else str(int(read_bps)))
        os.replace(partial, self.control)
        self.read_bps = read_bps

    def bytes_read(self) -> int:
        """Bytes the engine's tier has read through the throttle so far."""
        try:
            return int(self.control.with_suffix(".read").read_text())
        except FileNotFoundError:
            return 0

    def engine_config(self, config: EngineConfig) -> EngineConfig:
        """``config`` with its disk tier swapped for ``ThrottledDiskTier`` reading through
        this throttle."""
        transfer = dict(config.kv_transfer_config or {})
        extra = dict(transfer["kv_connector_extra_config"])
        (tier,) = extra["secondary_tiers"]
        extra["secondary_tiers"] = [
            {**tier, "type": ThrottledDiskTier.__name__, "module_path": __name__}
        ]
        transfer["kv_connector_extra_config"] = extra
        path = os.pathsep.join(
            p for p in (str(REPO_ROOT / "src"), str(REPO_ROOT), os.environ.get("PYTHONPATH"))
            if p
        )  # fmt: skip
        env = {**config.env, CONTROL_ENV: str(self.control), "PYTHONPATH": path}
        return dataclasses.replace(config, kv_transfer_config=transfer, env=env)


def throttled_disk(folder: Path) -> ThrottledDisk:
    """A throttled disk in ``folder`` (made if missing), unthrottled to begin with."""
    folder.mkdir(parents=True, exist_ok=True)
    disk = ThrottledDisk(folder)
    disk.throttle(None)
    return disk
