"""The cap holds for everything under the folder, at every instant, SIGKILL included.

A sampler freezes every writer process (SIGSTOP, then waits until each of their threads is
stopped), sums the files under the folder, thaws them and repeats. Each file counts twice
over: its size (``st_size``) and what it occupies (``st_blocks * 512``, what ``du`` reports
for it); both sums must stay within the cap. Folders themselves are not charged by the store
and not summed (docs/store.md says how much they take). Writers put fresh records from
several threads into their own namespaces under one root, so every put evicts, often another
process's records (one at a time, or in batches); some writers die (SIGKILL while frozen, or
``os._exit`` between an eviction and its unlinks) and are replaced, and a last store opened
afterwards reclaims what they left.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path
from typing import NamedTuple

import pytest

from kvtier.store import DiskStore
from tests.support.faults import FUZZ_PAYLOAD
from tests.support.store import disk_capacity, make_namespace
from tests.support.workers import put_forever

CAPACITY = disk_capacity(24, FUZZ_PAYLOAD)


class Footprint(NamedTuple):
    files: int
    size_bytes: int
    allocated_bytes: int
    folder_bytes: int


def footprint(root: Path) -> Footprint:
    files = size = allocated = folders = 0
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            try:
                folders += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                continue
        for name in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, name))
            except FileNotFoundError:  # only a process that is not frozen could remove it
                raise AssertionError(f"{name} vanished while every writer was frozen") from None
            files += 1
            size += st.st_size
            allocated += st.st_blocks * 512
    return Footprint(files, size, allocated, folders)


def largest(root: Path) -> list[tuple[int, str]]:
    """The biggest files under ``root`` (for a failure message)."""
    sizes = [
        (os.lstat(os.path.join(d, n)).st_size, os.path.relpath(os.path.join(d, n), root))
        for d, _, names in os.walk(root)
        for n in names
    ]
    return sorted(sizes, reverse=True)[:6]


def wait_stopped(pid: int) -> None:
    """Block until every thread of ``pid`` is stopped (or the process is gone)."""
    tasks = f"/proc/{pid}/task"
    while True:
        try:
            states = []
            for tid in os.listdir(tasks):
                with open(f"{tasks}/{tid}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
        except (FileNotFoundError, ProcessLookupError):
            # Gone: its folder vanished (ENOENT), or it exited while a thread's stat was
            # being read (ESRCH; a writer that crashes on purpose does).
            return
        if all(s in "TtZX" for s in states):
            return
        time.sleep(0.001)


def sample(
    root: Path,
    writers: int,
    threads: int,
    samples: int,
    kill_every: int,
    crash_at: str,
    batch: int = 1,
) -> list[Footprint]:
    ctx = multiprocessing.get_context("spawn")
    rng = random.Random(samples)

    def start(seed: int) -> multiprocessing.process.BaseProcess:
        process = ctx.Process(
            target=put_forever,
            args=(str(root), seed, threads, CAPACITY, crash_at, batch),
            daemon=True,
        )
        process.start()
        return process

    procs = [start(n) for n in range(writers)]
    seen: list[Footprint] = []
    try:
        deadline = time.monotonic() + 120
        while not (root / "index.sqlite3").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for n in range(samples):
            for p in procs:
                if p.pid is not None and p.is_alive():
                    os.kill(p.pid, signal.SIGSTOP)
            for p in procs:
                assert p.pid is not None
                wait_stopped(p.pid)
            seen.append(footprint(root))
            assert seen[-1].size_bytes <= CAPACITY, (seen[-1], largest(root))
            assert seen[-1].allocated_bytes <= CAPACITY, (seen[-1], largest(root))
            if kill_every and n % kill_every == kill_every - 1:
                victim = rng.randrange(writers)
                assert procs[victim].pid is not None
                os.kill(procs[victim].pid, signal.SIGKILL)  # frozen anywhere, mid-eviction too
            for p in procs:
                if p.pid is not None and p.is_alive():
                    os.kill(p.pid, signal.SIGCONT)
            for i, p in enumerate(procs):
                if not p.is_alive():
                    p.join()
                    assert p.exitcode in (-signal.SIGKILL, 17), p.exitcode  # 17: CrashingWriter
                    procs[i] = start(writers + n * writers + i)
            time.sleep(rng.uniform(0.005, 0.05))
    finally:
        for p in procs:
            if p.pid is not None and p.is_alive():
                os.kill(p.pid, signal.SIGKILL)
            p.join()
    return seen


@pytest.mark.parametrize(
    ("writers", "threads", "samples", "kill_every", "crash_at", "batch"),
    [
        pytest.param(2, 2, 60, 20, "", 1, id="2x2-writers"),
        pytest.param(2, 2, 100, 20, "", 4, id="2x2-writers-batches-of-4"),
        pytest.param(2, 2, 40, 0, "before_evict_unlink", 1, id="crash-mid-eviction"),
        pytest.param(
            4,
            4,
            600,
            50,
            "",
            1,
            id="4x4-writers-long",
            marks=[pytest.mark.slow, pytest.mark.faults],
        ),
    ],
)
def test_cap_holds_for_every_file_under_the_folder_at_every_instant(
    tmp_path: Path,
    writers: int,
    threads: int,
    samples: int,
    kill_every: int,
    crash_at: str,
    batch: int,
) -> None:
    root = tmp_path / "kvroot"
    seen = sample(root, writers, threads, samples, kill_every, crash_at, batch)
    busiest = max(seen, key=lambda f: f.allocated_bytes)
    print(
        f"cap {CAPACITY} B; {len(seen)} samples; peak {busiest.files} files, "
        f"{max(f.size_bytes for f in seen)} B by size, {busiest.allocated_bytes} B allocated, "
        f"folders {busiest.folder_bytes} B (not charged)"
    )
    assert max(f.files for f in seen) > 24, "the writers never filled the cap: nothing tested"
    # A store opened afterwards reclaims what the dead left, and everything adds up again.
    with DiskStore(root, make_namespace(model="footprint/check", block_bytes=FUZZ_PAYLOAD)) as s:
        assert s.capacity_bytes == CAPACITY  # adopted from the folder
        after = footprint(root)
        assert after.size_bytes <= CAPACITY and after.allocated_bytes <= CAPACITY, after
        assert s.footprint_bytes() <= CAPACITY
        print(f"index files take {s.footprint_bytes() - s.used_bytes()} B at the end")
