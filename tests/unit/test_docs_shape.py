"""The docs are the product's reference, not its history: the benchmarks page stays short,
dated experiments live under ``docs/bench/``, and the source names no benchmark run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
BENCH = DOCS / "bench"

#: The benchmarks page holds the current figures; anything longer is history to move.
BENCHMARKS_MAX_LINES = 400

_MONTH = r"(January|February|March|April|May|June|July|August|September|October|November|December)"
#: A heading that dates its section: an ISO date, or a month with a year ("December 2026").
DATED_HEADING = re.compile(
    rf"^#+\s.*(\b(19|20)\d\d-\d\d-\d\d\b|\b{_MONTH}\s+(\d{{1,2}},?\s+)?(19|20)\d\d\b).*$",
    re.M,
)
#: A benchmark run named by its card.
GPU_RUN = re.compile(r"H100|H200")
SOURCE_SUFFIXES = {".py", ".c", ".h", ".pyi"}


def _without_code_blocks(text: str) -> str:
    """Fenced blocks hold commands and log lines (``# on the GPU host``), not headings."""
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


def dated_headings(text: str) -> list[str]:
    return [m.group(0) for m in DATED_HEADING.finditer(_without_code_blocks(text))]


def reference_pages() -> list[Path]:
    """Every docs page outside ``docs/bench/``, where dated records belong."""
    return sorted(p for p in DOCS.rglob("*.md") if not p.is_relative_to(BENCH))


def test_benchmarks_page_stays_within_its_line_budget() -> None:
    lines = len((DOCS / "benchmarks.md").read_text().splitlines())
    assert lines <= BENCHMARKS_MAX_LINES, (
        f"docs/benchmarks.md has {lines} lines, over {BENCHMARKS_MAX_LINES}: keep the current "
        "figures there and move dated experiments whole to docs/bench/YYYY-MM-DD-topic.md, "
        "listed in docs/bench/README.md"
    )


@pytest.mark.parametrize("page", reference_pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_reference_pages_have_no_dated_headings(page: Path) -> None:
    found = dated_headings(page.read_text())
    assert not found, (
        f"{page.relative_to(ROOT)} has dated section headings {found}: a dated experiment "
        "belongs in docs/bench/ (say the date in the text of a current figure instead)"
    )


def test_source_names_no_gpu_run() -> None:
    hits = []
    for path in sorted((ROOT / "src").rglob("*")):
        if path.suffix not in SOURCE_SUFFIXES or not path.is_file():
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if GPU_RUN.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not hits, (
        "src/ names a benchmark run's card; state the reason and link the docs page instead:\n"
        + "\n".join(hits)
    )


def test_every_dated_record_is_in_the_bench_index() -> None:
    index = (BENCH / "README.md").read_text()
    records = sorted(p.name for p in BENCH.glob("[0-9][0-9][0-9][0-9]-[0-9][0-9]-[0-9][0-9]-*.md"))
    assert records, "docs/bench/ holds no dated records"
    missing = [name for name in records if f"({name})" not in index]
    assert not missing, f"docs/bench/README.md does not list {missing}"


@pytest.mark.parametrize(
    "heading",
    [
        "## Concurrent restores on the H200 (2026-12-02)",
        "### The shared tier, December 2026",
        "#### Runs of March 3, 2027",
    ],
)
def test_a_dated_heading_is_recognised(heading: str) -> None:
    assert dated_headings(f"intro\n{heading}\ntext\n") == [heading]


@pytest.mark.parametrize(
    "text",
    [
        "## The decision against the 1.05 bound\nMeasured 2026-12-06 on an H200.\n",
        "```bash\n# a comment in a command block, 2026-12-05\n```\n",
        "## Records across tensor-parallel sizes\n",
    ],
)
def test_an_undated_heading_or_a_date_in_text_passes(text: str) -> None:
    assert dated_headings(text) == []
