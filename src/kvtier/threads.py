"""OS-visible names for kvtier's threads.

Python 3.11 does not pass thread names to the kernel, so every thread of an engine shows up as
the process's name. kvtier's threads set their own (``kvtier-...``, cut to the kernel's 15
bytes) so that ``top -H``, ``ps -L`` and the overhead benchmark can tell them apart.
"""

import ctypes
import threading

_PR_SET_NAME = 15


def name_os_thread(name: str | None = None) -> bool:
    """Give the calling thread ``name`` (default: its Python name) in /proc. Never raises."""
    text = (name or threading.current_thread().name).encode()[:15]
    try:
        return ctypes.CDLL(None).prctl(_PR_SET_NAME, ctypes.c_char_p(text), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
