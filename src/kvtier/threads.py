"""OS-visible names for kvtier's threads, and the CPUs they may use.

Python 3.11 does not pass thread names to the kernel, so every thread of an engine shows up as
the process's name. kvtier's threads set their own (``kvtier-...``, cut to the kernel's 15
bytes) so that ``top -H``, ``ps -L`` and the overhead benchmark can tell them apart.
"""

import ctypes
import os
import threading

_PR_SET_NAME = 15


def name_os_thread(name: str | None = None) -> bool:
    """Give the calling thread ``name`` (default: its Python name) in /proc. Never raises."""
    text = (name or threading.current_thread().name).encode()[:15]
    try:
        return ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(text), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1
