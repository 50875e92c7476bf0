"""The soak's shutdown check: a server's processes get a grace period to exit after the
server does, and one that outlives it is named (and killed) rather than left behind."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.soak.runner import _survivors


def test_a_session_that_exits_within_the_grace_leaves_no_survivor() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(0.5)"], start_new_session=True
    )
    try:
        started = time.monotonic()
        assert _survivors([proc.pid], grace_s=20.0) == []
        assert time.monotonic() - started < 15.0  # returned when the session emptied
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_outlives_the_grace_is_named_with_its_command() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)  # soak-survivor"],
        start_new_session=True,
    )
    try:
        found = _survivors([proc.pid], grace_s=0.3)
        assert [s["pid"] for s in found] == [proc.pid]
        assert "soak-survivor" in str(found[0]["cmdline"])
    finally:
        proc.kill()
        proc.wait()
