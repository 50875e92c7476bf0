"""A file mapped by another live process (the fd closed: visible in /proc/PID/maps only)."""

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_HOLD = (
    "import mmap,os,sys,time; fd=os.open(sys.argv[1], os.O_RDWR); "
    "m=mmap.mmap(fd, 4096); os.close(fd); print('ready', flush=True); time.sleep(60)"
)


@contextmanager
def mapped_by_another_process(path: Path) -> Iterator[None]:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "ready"
        yield
    finally:
        holder.kill()
        holder.wait()
