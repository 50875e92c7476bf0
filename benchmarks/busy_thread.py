"""A thread running Python without pause, beside the code a benchmark times; and processes
doing the same.

The thread stands in for an engine's scheduler loop, which runs Python without pause while a
request waits for its restore: every time a reader gives the GIL up (a system call, a native
call, a checksum) it may then wait out the interpreter's switch interval to get it back. The
processes stand in for an engine's other busy processes (its worker, its API server), which
take CPU time from the readers and from a server on the same machine, but not the GIL.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def spinning(on: bool = True) -> Iterator[None]:
    """Run a spinning Python thread for the block's duration (nothing when ``on`` is false)."""
    if not on:
        yield
        return
    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    try:
        yield
    finally:
        stop.set()
        spinner.join()


@contextmanager
def spinning_processes(count: int) -> Iterator[None]:
    """Run ``count`` processes that spin without pause for the block's duration."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
