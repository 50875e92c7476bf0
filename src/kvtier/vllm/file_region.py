"""A host pool backed by a sparse file on local disk instead of ``/dev/shm``.

vLLM admits a restore only when all its chunks sit in the host pool at once, so the host pool's
size bounds the longest prefix a restore can bring back. On a machine whose RAM is small (or
shared with the engine's own KV cache) a RAM pool cannot be large. ``FileOffloadRegion`` puts
the pool in a file on local disk:

* created ``0600`` with ``O_EXCL | O_NOFOLLOW`` in ``host_pool_dir`` (created ``0700``) and
  sized with ``ftruncate``: a *sparse* file. Nothing is pre-faulted (upstream's
  ``SharedOffloadRegion`` pre-faults with ``MADV_POPULATE_WRITE``, which would allocate the
  whole file): only rows that are written cost disk blocks and page cache.
* mapped ``MAP_SHARED`` by every worker and by the scheduler, exactly like the ``/dev/shm``
  region, with the same row layout (this class reuses upstream's view methods).
* its name is dropped as soon as every process has mapped it (``KvtierCpuSpec.get_manager``),
  so no exit path leaves it behind; a file left by an engine that died earlier (between
  creation and that point) is removed at the next start-up (``clean_stale_pool_files``).

Trade-offs (see docs/host-pool-on-disk.md for measurements): the page cache keeps hot rows in
RAM but may drop clean ones and must write dirty ones back, so a restore of a row that was
evicted from the page cache reads the disk; the kernel's write-back adds disk writes roughly
equal to the store traffic; the file system needs free space up to the pool size (checked at
start-up, because writing to a page of a sparse file on a full disk kills the process with
SIGBUS instead of failing a call).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import time
from pathlib import Path

import torch
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

from kvtier.errors import ConfigError
from kvtier.hostpool.regions import clean_stale_regions
from kvtier.units import format_size

logger = logging.getLogger(__name__)

POOL_PREFIX = "kvtier_pool_"
POOL_GLOB = f"{POOL_PREFIX}*.mmap"
_WAIT_TIMEOUT_S = 30.0


def pool_path(folder: str | os.PathLike[str], engine_id: str) -> Path:
    """Where the disk-backed pool of ``engine_id`` lives inside ``folder``."""
    return Path(folder) / f"{POOL_PREFIX}{engine_id}.mmap"


def clean_stale_pool_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove pool files in ``folder`` that no live process holds (left by dead engines)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return clean_stale_regions(folder, pattern=POOL_GLOB)


def check_disk_space(folder: Path, pool_bytes: int) -> None:
    """Raise ``ConfigError`` unless ``folder``'s file system can hold the whole pool."""
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    if pool_bytes > free:
        raise ConfigError(
            f"kvtier: host pool file of {format_size(pool_bytes)} does not fit on the file "
            f"system of host_pool_dir={str(folder)!r} ({format_size(free)} free; a sparse file "
            "grows up to its full size as rows are used). Give a smaller host_pool or another "
            "host_pool_dir"
        )


class FileOffloadRegion(SharedOffloadRegion):
    """``SharedOffloadRegion`` over a sparse file in ``folder``; never pre-faulted.

    Same constructor contract as upstream's (the first process to open the file creates and
    sizes it, the others wait for the size), minus the barrier and pinning, which the CPU
    backend does not use. ``rank=None`` maps the region without a worker slot (scheduler).
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        engine_id: str,
        num_chunks: int,
        rank: int | None,
        kv_bytes_per_chunk: int,
        cpu_page_size: int,
    ) -> None:
        # Deliberately not calling SharedOffloadRegion.__init__: it hard-codes /dev/shm and
        # pre-faults the mapping. Every attribute its methods use is set here instead.
        self.page_size = mmap.PAGESIZE
        if kv_bytes_per_chunk % self.page_size:
            raise ValueError(f"row stride {kv_bytes_per_chunk} is not page aligned")
        self.num_chunks = num_chunks
        self._row_stride = kv_bytes_per_chunk
        self.total_size_bytes = num_chunks * kv_bytes_per_chunk
        folder = Path(folder)
        self.mmap_path = str(pool_path(folder, engine_id))
        self._creator = False
        self.rank = rank
        if rank is not None:
            self._worker_offset = rank * cpu_page_size
            self._worker_area_end = (rank + 1) * cpu_page_size
        self.fd: int | None = None
        self.mmap_obj: mmap.mmap | None = None
        self._views: list[torch.Tensor] = []
        self._canonical_offset = 0
        self.is_pinned = False
        self.pinned_addresses: list[int] = []
        try:
            self.fd = self._open(folder)
            self.mmap_obj = mmap.mmap(
                self.fd,
                self.total_size_bytes,
                flags=mmap.MAP_SHARED,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
            )
        except BaseException:
            self._release()
            raise
        self._base = torch.frombuffer(memoryview(self.mmap_obj), dtype=torch.int8)

    def _open(self, folder: Path) -> int:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(self.mmap_path, flags | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            fd = os.open(self.mmap_path, flags)
            try:
                self._wait_for_size(fd)
            except BaseException:
                os.close(fd)
                raise
            logger.info("kvtier: mapped disk-backed host pool %s", self.mmap_path)
            return fd
        self._creator = True
        try:
            check_disk_space(folder, self.total_size_bytes)
            os.ftruncate(fd, self.total_size_bytes)  # sparse: no block is allocated
        except BaseException:
            os.close(fd)
            raise
        logger.info(
            "kvtier: created disk-backed host pool %s (%s sparse, %d rows)",
            self.mmap_path,
            format_size(self.total_size_bytes),
            self.num_chunks,
        )
        return fd

    def _wait_for_size(self, fd: int) -> None:
        deadline = time.monotonic() + _WAIT_TIMEOUT_S
        while True:
            st = os.fstat(fd)
            if st.st_size >= self.total_size_bytes:
                return
            if st.st_nlink == 0:
                raise RuntimeError(f"kvtier: the creator of {self.mmap_path} failed")
            if time.monotonic() > deadline:
                raise TimeoutError(f"kvtier: {self.mmap_path} never reached its size")
            time.sleep(0.005)

    def allocated_bytes(self) -> int:
        """Disk blocks the file really uses (a sparse file's untouched rows cost nothing)."""
        if self.fd is None:
            return 0
        return os.fstat(self.fd).st_blocks * 512

    def _release(self) -> None:
        if self.mmap_obj is not None:
            with contextlib.suppress(BufferError, ValueError):
                self.mmap_obj.close()
            self.mmap_obj = None
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self._creator:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.mmap_path)
            self._creator = False

    def cleanup(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(OSError):
                logger.info(
                    "kvtier: disk-backed host pool %s: %s mapped, %s allocated on disk",
                    self.mmap_path,
                    format_size(self.total_size_bytes),
                    format_size(self.allocated_bytes()),
                )
        super().cleanup()
