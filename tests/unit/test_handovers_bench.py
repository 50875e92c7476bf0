"""The handovers tool refuses, naming the fix, where it cannot place its perf probe; where it
can (root and perf), it counts a write thread's GIL re-acquisitions for each batch."""

from __future__ import annotations

import os
import shutil

import pytest
from typer.testing import CliRunner

from benchmarks import handovers
from benchmarks.cli import app


def test_without_perf_the_command_names_the_fix_and_exits_2(monkeypatch) -> None:
    monkeypatch.setattr(handovers.shutil, "which", lambda name: None)
    result = CliRunner().invoke(app, ["handovers", "--batches", "1"])
    assert result.exit_code == 2
    assert "needs perf on PATH" in result.output
    assert "Traceback" not in result.output


def test_without_root_the_command_names_the_fix(monkeypatch) -> None:
    monkeypatch.setattr(handovers.shutil, "which", lambda name: "/usr/bin/perf")
    monkeypatch.setattr(handovers.os, "geteuid", lambda: 1000)
    with pytest.raises(RuntimeError, match="run it as root"):
        handovers.check_perf()


@pytest.mark.skipif(
    shutil.which("perf") is None or os.geteuid() != 0, reason="needs perf and root (a uprobe)"
)
def test_a_batch_s_re_acquisitions_are_counted_and_placed(tmp_path) -> None:
    try:
        account = handovers.run(batches=3, folder=tmp_path)
    except RuntimeError as exc:  # a kernel without uprobes, a libpython without symbols
        pytest.skip(f"perf could not probe here: {exc}")
    if account.total == 0:  # perf attached nothing: a container that refuses the probe
        pytest.skip("perf recorded no event here")
    assert account.batches == 3
    assert any("write_records" in site for site in account.sites), account.sites
