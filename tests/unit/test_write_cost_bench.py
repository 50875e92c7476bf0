"""The write-cost benchmark runs each setting and reports what it measured."""

from __future__ import annotations

import errno
import mmap
import os
from pathlib import Path

import pytest

from benchmarks import write_cost


def _o_direct_works(folder: Path) -> bool:
    page = mmap.mmap(-1, mmap.PAGESIZE)
    try:
        fd = os.open(folder / "probe", os.O_WRONLY | os.O_CREAT | os.O_DIRECT, 0o600)
    except (OSError, AttributeError):
        return False
    try:
        os.write(fd, page)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    finally:
        os.close(fd)
    return True


def test_every_setting_writes_at_the_rate_beside_the_loop(tmp_path: Path) -> None:
    if not _o_direct_works(tmp_path):
        pytest.skip("O_DIRECT writes are refused in the temp folder (the fs setting needs them)")
    record_bytes = 64 << 10
    settings = [*write_cost.SETTINGS, "kvtier/process"]
    results = write_cost.run(
        settings,
        record_bytes,
        bytes_per_s=40 * record_bytes,
        threads=2,
        seconds=0.5,
        rounds=1,
        shape=write_cost.LoopShape(ops_per_step=20, section_iterations=10),
        folder=tmp_path,
    )
    assert list(results) == settings
    for setting, rounds in results.items():
        (result,) = rounds
        assert result.steps_per_s > 0
        assert result.step_p50_ms <= result.step_p99_ms
        # the loop's thread spends CPU on every step, in this process or its own
        assert 0 < result.loop_cpu_ms_per_step <= 10 * result.step_p99_ms, result
        if setting == "none":
            assert result.puts == 0
        else:  # 40 records a second: about 20 in the half second
            assert result.puts >= 5, (setting, result.puts)
            assert 0.5 <= result.written_mb_per_s / (40 * record_bytes / 1e6) <= 1.5, result
    table = write_cost.table(results, record_bytes, 40 * record_bytes)
    assert "| kvtier/process |" in table
    assert list(tmp_path.iterdir()) == [tmp_path / "probe"]  # the records are gone


def test_an_unknown_setting_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown setting"):
        write_cost.run(["kvtier", "bogus"], 64 << 10, 1e6)
