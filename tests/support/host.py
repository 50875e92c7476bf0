"""Host facilities some tests need, each probed once: why this machine lacks it, or None.

Being root is not enough to know: a container's root may be refused ``mount`` (no
CAP_SYS_ADMIN) or ``chown`` (no CAP_CHOWN), and a host may lack loop devices or a binary. So
each probe tries the thing itself, once per process, and a test that needs it calls
``need(...)``, which skips with the reason. Kept free of fixtures so helper processes can import
it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

#: The uid/gid files of "another user" are given (nobody).
NOBODY = 65534


def need(reason: str | None) -> None:
    """Skip the calling test with ``reason`` unless it is None."""
    if reason is not None:
        pytest.skip(reason)


def binary_missing(name: str, hint: str) -> str | None:
    """Why ``name`` cannot be run here (not on PATH; ``hint`` says how to get it), or None."""
    return None if shutil.which(name) else f"no {name} on PATH ({hint})"


@functools.cache
def mount_unavailable() -> str | None:
    """Why this process cannot mount file systems (a tmpfs is tried), or None."""
    if os.geteuid() != 0:
        return "needs root to mount file systems"
    for tool in ("mount", "umount"):
        if (missing := binary_missing(tool, "util-linux")) is not None:
            return missing
    with tempfile.TemporaryDirectory(prefix="kvtier-mount-probe-") as folder:
        tried = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", folder],
            capture_output=True,
            text=True,
            check=False,
        )
        if tried.returncode != 0:
            return f"mount refused here: {tried.stderr.strip() or tried.returncode}"
        subprocess.run(["umount", folder], check=False)
    return None


@functools.cache
def loop_mount_unavailable() -> str | None:
    """Why an ext4 image cannot be loop-mounted here, or None."""
    if (reason := mount_unavailable()) is not None:
        return reason
    if not Path("/dev/loop-control").exists():
        return "no loop devices (/dev/loop-control missing)"
    return binary_missing("mkfs.ext4", "e2fsprogs")


@functools.cache
def chown_unavailable() -> str | None:
    """Why this process cannot give a file to another user (uid 65534), or None."""
    with tempfile.NamedTemporaryFile(prefix="kvtier-chown-probe-") as f:
        try:
            os.chown(f.name, NOBODY, NOBODY)
        except PermissionError:
            return "needs root (CAP_CHOWN) to make a file of another user"
    return None


@functools.cache
def capability_drop_unavailable() -> str | None:
    """Why a child cannot run as root minus the file-permission overrides, or None."""
    if os.geteuid() != 0:
        return "drops root's capabilities; run as root"
    return binary_missing("setpriv", "util-linux")
