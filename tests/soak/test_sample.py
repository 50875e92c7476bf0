"""The soak's sampler on this machine: a folder's allocated bytes as ``du`` counts them, this
process's descriptors and threads, its children summed in, and a dead pid skipped."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from benchmarks.soak import sample


def make_store_like_folder(root: Path) -> None:
    """Files of several sizes in nested folders, a sparse file, a symlink, a hard link, a FIFO
    and temp files (what a ``records_damaged`` fault may leave)."""
    ns = root / "ns"
    for sub in ("blocks/0a", "blocks/ff", "tmp", "sessions"):
        (ns / sub).mkdir(parents=True)
    for n, size in enumerate((0, 1, 4095, 4096, 70_000, 1 << 20)):
        (ns / "blocks" / ("0a" if n % 2 else "ff") / f"{n}.kvb").write_bytes(b"x" * size)
    with open(ns / "blocks" / "0a" / "sparse.kvb", "wb") as f:
        f.truncate(8 << 20)
        f.write(b"y")
    (ns / "tmp" / "abc.1.s.tmp").write_bytes(b"z" * 5000)
    (ns / ".namespace.json.123.0badcafe.tmp").write_bytes(b"{}")
    (ns / "namespace.json").write_bytes(b"{}")
    (ns / "link").symlink_to(ns / "namespace.json")
    os.link(ns / "blocks" / "ff" / "4.kvb", ns / "blocks" / "0a" / "hard.kvb")
    os.mkfifo(ns / "blocks" / "ff" / "fifo.kvb")
    for n in range(300):  # a folder that grows past one allocation unit
        (ns / "sessions" / f"session-with-a-long-name-{n:04}.lock").touch()


@pytest.mark.skipif(shutil.which("du") is None, reason="no du binary to compare with")
def test_folder_usage_equals_du(tmp_path: Path) -> None:
    make_store_like_folder(tmp_path)
    du = subprocess.run(
        ["du", "-s", "--block-size=1", str(tmp_path)], capture_output=True, text=True, check=True
    )
    usage = sample.folder_usage(tmp_path)
    assert usage.files_bytes + usage.dirs_bytes == int(du.stdout.split()[0])
    # The folders are counted, not only the files (on tmpfs they allocate nothing).
    folders = [tmp_path] + [Path(d) / n for d, names, _ in os.walk(tmp_path) for n in names]
    assert usage.dirs_bytes == sum(os.lstat(f).st_blocks * 512 for f in folders)
    assert len(folders) == 7  # the root, ns, blocks, 0a, ff, tmp, sessions


def test_folder_usage_counts_temp_files_and_a_missing_folder_is_empty(tmp_path: Path) -> None:
    make_store_like_folder(tmp_path)
    assert sample.folder_usage(tmp_path).temp_files == 2
    assert sample.folder_usage(tmp_path / "gone") == (0, 0, 0)


def test_take_reports_this_process_and_skips_a_dead_pid(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    make_store_like_folder(tmp_path)
    got = sample.take({"me": os.getpid(), "dead": dead.pid}, {"disk": (tmp_path, 1 << 30)})
    assert set(got["processes"]) == {"me"}
    me = got["processes"]["me"]
    assert me["pid"] == os.getpid() and me["fds"] > 0 and me["threads"] > 0
    assert me["rss_bytes"] > 1 << 20
    folder = got["folders"]["disk"]
    assert folder["du_bytes"] == folder["files_bytes"] + folder["dirs_bytes"] > 0
    assert folder["cap_bytes"] == 1 << 30
    assert got["temp_files"] == 2
    assert isinstance(got["shm_regions"], int)


def test_threads_and_children_are_summed_in() -> None:
    alone = sample.process_tree_usage(os.getpid())
    stop = threading.Event()
    worker = threading.Thread(target=stop.wait)
    worker.start()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with_both = sample.process_tree_usage(os.getpid())
        child_alone = sample.process_tree_usage(child.pid)
    finally:
        child.kill()
        child.wait()
        stop.set()
        worker.join()
    assert alone is not None and with_both is not None and child_alone is not None
    assert with_both["threads"] >= alone["threads"] + 1 + child_alone["threads"]
    assert with_both["rss_bytes"] > alone["rss_bytes"]


def fake_process(
    proc: Path, pid: int, ppid: int, name: str, rss_kib: int, state: str = "S"
) -> None:
    """A /proc/PID with the lines the sampler reads: stat (parent), status, fd/ (3 fds)."""
    (proc / str(pid) / "fd").mkdir(parents=True)
    for fd in range(3):
        (proc / str(pid) / "fd" / str(fd)).touch()
    (proc / str(pid) / "stat").write_text(f"{pid} ({name}) {state} {ppid} 1 1 0 -1\n")
    (proc / str(pid) / "status").write_text(
        f"Name:\t{name}\nUmask:\t0022\nState:\t{state} (x)\nThreads:\t{pid % 10 + 1}\n"
        f"VmRSS:\t{rss_kib} kB\n"
    )


def test_a_server_tree_is_split_by_role_and_the_roles_add_up(tmp_path: Path) -> None:
    """vLLM's layout: the API front-end, its engine core, helpers of one name under both."""
    fake_process(tmp_path, 100, 1, "python", 1000)
    fake_process(tmp_path, 101, 100, "VLLM::EngineCor", 5000)
    fake_process(tmp_path, 102, 101, "python", 30)  # a resource tracker under the engine
    fake_process(tmp_path, 103, 100, "python", 20)
    fake_process(tmp_path, 200, 1, "redis-server", 99)  # not in the tree
    got = sample.take({"srv": 100}, {}, proc=tmp_path)["processes"]["srv"]
    assert got["by_role"] == {
        sample.TOP_ROLE: {"count": 1, "fds": 3, "threads": 1, "rss_bytes": 1000 * 1024},
        "VLLM::EngineCor": {"count": 1, "fds": 3, "threads": 2, "rss_bytes": 5000 * 1024},
        "python": {"count": 2, "fds": 6, "threads": 3 + 4, "rss_bytes": 50 * 1024},
    }
    for key in ("fds", "threads", "rss_bytes"):
        assert got[key] == sum(role[key] for role in got["by_role"].values())


def test_a_vanished_or_zombie_descendant_is_left_out_of_every_role(tmp_path: Path) -> None:
    fake_process(tmp_path, 100, 1, "python", 1000)
    fake_process(tmp_path, 101, 100, "VLLM::EngineCor", 5000, state="Z")
    fake_process(tmp_path, 102, 100, "python", 20)
    (tmp_path / "102" / "status").unlink()  # exited between the stat pass and its read
    got = sample.process_tree_usage(100, proc=tmp_path)
    assert got is not None
    assert set(got["by_role"]) == {sample.TOP_ROLE}
    assert got["rss_bytes"] == 1000 * 1024


def test_a_real_child_is_split_out_under_its_command_name() -> None:
    child = subprocess.Popen(["sleep", "30"])
    try:
        got = sample.process_tree_usage(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert got is not None
    assert got["by_role"]["sleep"]["count"] == 1
    assert got["by_role"]["sleep"]["rss_bytes"] > 0
    assert got["by_role"][sample.TOP_ROLE]["rss_bytes"] > 1 << 20
