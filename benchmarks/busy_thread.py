"""A thread running Python without pause, beside the code a benchmark times.

It stands in for an engine's scheduler loop, which runs Python without pause while a request
waits for its restore: every time a reader gives the GIL up (a system call, a native call, a
checksum) it may then wait out the interpreter's switch interval to get it back.
"""

from __future__ import annotations

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
