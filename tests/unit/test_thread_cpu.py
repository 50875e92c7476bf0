"""kvtier's OS thread names and the per-session CPU split the overhead bench reports."""

import subprocess
import sys
import threading
from pathlib import Path

from kvtier.bench.harness.cpu import session_cpu
from kvtier.threads import name_os_thread

CHILD = """
import sys, threading, time
sys.path.insert(0, sys.argv[1])
from kvtier.threads import name_os_thread

def spin(seconds, then_wait=None):
    name_os_thread("kvtier-spin")
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass
    spun.set()
    if then_wait is not None:
        then_wait.wait()

spun, release = threading.Event(), threading.Event()
ended = threading.Thread(target=spin, args=(0.6,))
ended.start()
ended.join()  # its CPU time must still count in the total
live = threading.Thread(target=spin, args=(0.4, release))
spun.clear()
live.start()
end = time.thread_time() + 0.3
while time.thread_time() < end:
    pass
spun.wait()
print("spun", flush=True)
sys.stdin.readline()
release.set()
live.join()
"""


def test_a_thread_names_itself_for_the_kernel() -> None:
    seen: list[str] = []

    def body() -> None:
        assert name_os_thread("kvtier-naming-test-long")
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == ["kvtier-naming-t\n"]  # the kernel keeps 15 bytes


def test_session_cpu_splits_kvtier_threads_from_the_rest() -> None:
    src = str(Path(__file__).resolve().parents[2] / "src")
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, src],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "spun"
        split = session_cpu(child.pid)
        # Live kvtier thread: 0.4 s; the ended one (0.6 s) is no longer listed as a thread.
        assert 0.3 <= split.kvtier_s <= 0.8
        # Total includes the ended thread, the live one and the main thread's 0.3 s.
        assert split.total_s >= 1.2
        assert 0 < split.kvtier_share < 0.5
        assert session_cpu(child.pid + 10**7).total_s == 0.0  # no such session
        child.stdin.write("\n")
        child.stdin.flush()
    finally:
        child.wait(timeout=30)
