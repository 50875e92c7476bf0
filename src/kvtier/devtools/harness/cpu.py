"""CPU seconds used by an engine's process tree, split into kvtier's threads and the rest.

An engine child runs in its own session (``start_new_session``), so its processes are the ones
whose session id is the child's pid. kvtier names its threads ``kvtier-...`` for the kernel
(kvtier.threads); everything else is vLLM, torch and Python.
"""

import os
from dataclasses import dataclass
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class CpuSplit:
    kvtier_s: float
    total_s: float

    @property
    def kvtier_share(self) -> float:
        return self.kvtier_s / self.total_s if self.total_s else 0.0


def _stat_fields(path: Path) -> list[str] | None:
    """Fields of a /proc stat file after the ``(comm)`` field, or None if it vanished."""
    try:
        text = path.read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def session_cpu(session_id: int) -> CpuSplit:
    """User + system CPU seconds of the processes in ``session_id`` (all their threads, ended
    ones included) and of the live ``kvtier-...`` threads among them."""
    kvtier = total = 0.0
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        fields = _stat_fields(proc / "stat")
        if fields is None or int(fields[3]) != session_id:  # field 6: session
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime
        try:
            tasks = list((proc / "task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                comm = (task / "comm").read_text()
            except OSError:
                continue
            if comm.startswith("kvtier") and (task_fields := _stat_fields(task / "stat")):
                kvtier += (int(task_fields[11]) + int(task_fields[12])) / _TICK
    return CpuSplit(kvtier, total)
