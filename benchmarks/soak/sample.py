"""One ``sample`` event of the soak: what the servers hold (descriptors, threads, RSS: summed
over each server's process tree and split by process role), what the disk folders take
against their caps, and what could leak (/dev/shm regions, temp files).

Cheap by design (it runs every ~5 s for an hour): /proc reads and one ``lstat`` per entry
of each folder, no subprocess. A pid or file that vanishes mid-sample is skipped, never an
error: servers are killed on purpose and the store deletes files while we walk.

The folder figures are allocated bytes (``st_blocks * 512``) of every entry under the folder,
the folder itself included: what ``du -s --block-size=1`` prints, and what the disk tier's cap
bounds (``kvtier.store.disk.folders``: the cap covers the folders as well as the files, since
a namespace's 261 folders take about 1 MiB). The store charges each folder at least one 4 KiB
unit and files their size rounded up to it, so on ext4/xfs these figures and its charge agree
to within what it has not yet measured; on tmpfs a folder allocates no blocks (du shows 0)
and the store's charge is the larger. A file with several names (a ``records_damaged``
fault hard-links records) is counted once, as ``du`` does.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import NamedTuple

from kvtier.store.disk import layout

#: The host-pool region files vLLM maps (``kvtier.hostpool.regions.REGION_GLOB`` is the narrower
#: ``vllm_offload_*.mmap*``; any ``vllm_offload_`` file left behind is a leak). kvtier keeps
#: no other files in /dev/shm: its disk-backed pool lives in ``host_pool_dir``.
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "vllm_offload_"
PROC = Path("/proc")
#: The ``by_role`` key of the labelled process itself (its descendants are keyed by name).
TOP_ROLE = "top"


def take(
    processes: Mapping[str, int], folders: Mapping[str, tuple[Path, int]], proc: Path = PROC
) -> dict:
    """The ``sample`` event's fields (without ``type``/``t``) for the labelled pids (each
    summed over the process and its descendants, and split by role) and folders (path,
    cap_bytes). ``proc`` is the /proc to read (a test's fake)."""
    children = _children_by_parent(proc)
    procs = {}
    for label, pid in processes.items():
        usage = process_tree_usage(pid, children, proc)
        if usage is not None:
            procs[label] = {"pid": pid, **usage}
    found = {}
    temp_by_path: dict[str, int] = {}  # two labels on one folder count its temps once
    for label, (path, cap_bytes) in folders.items():
        usage = folder_usage(Path(path))
        found[label] = {
            "path": str(path),
            "cap_bytes": cap_bytes,
            "files_bytes": usage.files_bytes,
            "dirs_bytes": usage.dirs_bytes,
            "du_bytes": usage.files_bytes + usage.dirs_bytes,
        }
        temp_by_path[os.path.realpath(path)] = usage.temp_files
    return {
        "processes": procs,
        "folders": found,
        "shm_regions": shm_regions(),
        "temp_files": sum(temp_by_path.values()),
    }


def process_tree_usage(
    pid: int, children: Mapping[int, list[int]] | None = None, proc: Path = PROC
) -> dict | None:
    """fds, threads and rss_bytes of ``pid`` and its descendants, summed, and the same per
    role in ``by_role``; None if ``pid`` is gone. A descendant that exits mid-read is left out.

    The role of ``pid`` itself is ``TOP_ROLE`` (for a vLLM server, its API front-end); a
    descendant's is its command name (``/proc/PID/comm``: vLLM's engine core retitles itself
    ``VLLM::EngineCore``, which the kernel keeps as ``VLLM::EngineCor``; its model runner
    ``VLLM::Worker``), so that a role keeps
    its key across restarts and a figure can follow it. Descendants of one name are summed,
    ``count`` saying how many there were. The name comes from the ``status`` file read for
    the other figures anyway: the split costs no extra read."""
    if children is None:
        children = _children_by_parent(proc)
    top = _one_process(pid, proc)
    if top is None:
        return None
    name, usage = top
    total = dict(usage)
    by_role = {TOP_ROLE: {"count": 1, **usage}}
    for child in _descendants(pid, children):
        found = _one_process(child, proc)
        if found is None:
            continue
        name, usage = found
        role = by_role.setdefault(name, {"count": 0, "fds": 0, "threads": 0, "rss_bytes": 0})
        role["count"] += 1
        for key, value in usage.items():
            total[key] += value
            role[key] += value
    return {**total, "by_role": by_role}


def _one_process(pid: int, proc: Path = PROC) -> tuple[str, dict] | None:
    """The command name and fds, threads, rss_bytes of ``pid``; None if it is gone."""
    try:
        status = (proc / str(pid) / "status").read_text()
        fds = len(os.listdir(proc / str(pid) / "fd"))
    except OSError:  # gone (or, in another user's namespace, unreadable): skipped
        return None
    name = ""
    threads = rss_kib = 0
    for line in status.splitlines():
        if line.startswith("Name:"):
            name = line[len("Name:") :].strip()
        elif line.startswith("Threads:"):
            threads = int(line.split()[1])
        elif line.startswith("VmRSS:"):
            rss_kib = int(line.split()[1])
        elif line.startswith("State:") and line.split()[1] in ("Z", "X"):
            return None  # a zombie holds nothing; counting its 0s would look like a drop
    return name, {"fds": fds, "threads": threads, "rss_bytes": rss_kib * 1024}


def _children_by_parent(proc: Path = PROC) -> dict[int, list[int]]:
    """Every visible process's children, from /proc/*/stat (one pass for all labels: the
    per-task ``children`` files miss children of threads other than the main one)."""
    found: dict[int, list[int]] = {}
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"{entry.path}/stat", "rb") as f:
                text = f.read()
        except OSError:
            continue
        # The command name is in parentheses and may hold spaces or ')': split after the last.
        fields = text[text.rfind(b")") + 2 :].split()
        if len(fields) > 1:
            found.setdefault(int(fields[1]), []).append(int(entry.name))
    return found


def _descendants(pid: int, children: Mapping[int, list[int]]) -> Iterator[int]:
    pending = list(children.get(pid, ()))
    seen = {pid}
    while pending:
        child = pending.pop()
        if child in seen:
            continue
        seen.add(child)
        yield child
        pending.extend(children.get(child, ()))


class FolderUsage(NamedTuple):
    """Allocated bytes under a folder (the folder itself among ``dirs_bytes``) and its
    kvtier temp files."""

    files_bytes: int
    dirs_bytes: int
    temp_files: int


def folder_usage(root: Path) -> FolderUsage:
    """One walk of ``root``: allocated bytes of its non-folders and folders, and its temp
    files (everything in a namespace's ``tmp/``, records being written, and any ``*.tmp``
    elsewhere, ``write_small_file``'s temps). Symlinks are not followed (their own blocks
    count as a file's); an entry removed mid-walk is skipped; a missing root is all zeros."""
    try:
        st = os.lstat(root)
    except OSError:
        return FolderUsage(0, 0, 0)
    if not stat.S_ISDIR(st.st_mode):
        return FolderUsage(st.st_blocks * 512, 0, 0)
    files_bytes, dirs_bytes, temps = 0, st.st_blocks * 512, 0
    linked: set[tuple[int, int]] = set()  # (device, inode) of files with several names
    pending = [str(root)]
    while pending:
        folder = pending.pop()
        in_tmp = os.path.basename(folder) == layout.TMP
        try:
            with os.scandir(folder) as entries:
                for entry in entries:
                    try:
                        est = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(est.st_mode):
                        dirs_bytes += est.st_blocks * 512
                        pending.append(entry.path)
                        continue
                    if in_tmp or entry.name.endswith(layout.TEMP_SUFFIX):
                        temps += 1
                    if est.st_nlink > 1:
                        if (est.st_dev, est.st_ino) in linked:
                            continue
                        linked.add((est.st_dev, est.st_ino))
                    files_bytes += est.st_blocks * 512
        except OSError:
            continue
    return FolderUsage(files_bytes, dirs_bytes, temps)


def shm_regions(shm_dir: Path = SHM_DIR) -> int:
    """Host-pool region files in /dev/shm (of any engine on this machine)."""
    try:
        with os.scandir(shm_dir) as entries:
            return sum(1 for e in entries if e.name.startswith(SHM_PREFIX))
    except OSError:
        return 0
