"""Host-pool regions an engine left in /dev/shm, told by its own log.

/dev/shm is the machine's: an engine test on the other worker has its own regions there
while it runs, so a test that an engine left nothing looks only at the regions that engine's
log names (vLLM logs the path of every region it maps).
"""

from __future__ import annotations

import re
from pathlib import Path

from kvtier.hostpool.regions import SHM_DIR

REGION_PATH = re.compile(r"/dev/shm/(vllm_offload_[\w.-]+?\.mmap)")


def regions_left_by(log: Path) -> set[str]:
    """The region files ``log`` names that still exist; fails if it names none (then the
    check would prove nothing: the log format changed)."""
    named = set(REGION_PATH.findall(log.read_text(errors="replace")))
    assert named, f"{log} names no /dev/shm region: cannot tell what the engine left"
    return {name for name in named if (SHM_DIR / name).exists()}
