"""TEMPORARY (lead's branch only): stand-ins for the store agent's folder API, replaced at merge."""

import os
from pathlib import Path

from kvtier.store import layout


def check_root(root: Path) -> None:
    layout.check_private_dir(Path(root), "root")


def effective_capacity(root: Path, requested: int | None) -> int:
    if requested is not None:
        return requested
    probe = Path(root)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    st = os.statvfs(probe)
    return min(int(st.f_blocks * st.f_frsize * 0.25), 256 * 2**30)
