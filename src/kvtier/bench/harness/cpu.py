"""CPU seconds used by an engine's process tree, split into kvtier's threads and the rest.

An engine child runs in its own session (``start_new_session``), so its processes are the ones
whose session id is the child's pid. kvtier names its threads ``kvtier-...`` for the kernel
(kvtier.threads); everything else is vLLM, torch and Python. psutil gives the processes and
their threads' CPU times; only the thread names are read from /proc, which psutil does not
expose.
"""

import contextlib
import os
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class CpuSplit:
    kvtier_s: float
    total_s: float

    @property
    def kvtier_share(self) -> float:
        return self.kvtier_s / self.total_s if self.total_s else 0.0


def _thread_name(pid: int, tid: int) -> str:
    """The kernel's name of a thread ('' if it is gone)."""
    try:
        with open(f"/proc/{pid}/task/{tid}/comm", encoding="utf-8", errors="replace") as f:
            return f.read().rstrip("\n")
    except OSError:
        return ""


def session_cpu(session_id: int) -> CpuSplit:
    """User + system CPU seconds of the processes in ``session_id`` (all their threads, ended
    ones included) and of the live ``kvtier-...`` threads among them."""
    kvtier = total = 0.0
    for proc in psutil.process_iter():
        # A process can end between listing and reading: it then counts for nothing.
        with contextlib.suppress(psutil.Error, ProcessLookupError, PermissionError):
            if os.getsid(proc.pid) != session_id:
                continue
            times = proc.cpu_times()
            threads = proc.threads()
            total += times.user + times.system
            kvtier += sum(
                t.user_time + t.system_time
                for t in threads
                if _thread_name(proc.pid, t.id).startswith("kvtier")
            )
    return CpuSplit(kvtier, total)
