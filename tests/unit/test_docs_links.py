"""Every page the README and docs/ point to exists: relative links, their anchors, and the
``docs/bench/...`` result files pages cite."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
BENCH = re.compile(r"docs/bench/[\w.*{},/-]+")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, flags=re.M)}


def _expand(pattern: str) -> list[str]:
    """``a.{json,md}`` -> ``a.json``, ``a.md`` (the one brace form pages use)."""
    match = re.search(r"\{([^}]*)\}", pattern)
    if not match:
        return [pattern]
    head, tail = pattern[: match.start()], pattern[match.end() :]
    return [head + alt + tail for alt in match.group(1).split(",")]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):
            continue  # an absolute URL
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in _anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links that lead nowhere: {broken}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_cited_result_files_exist(page: Path) -> None:
    missing = []
    for cited in BENCH.findall(page.read_text()):
        for pattern in _expand(cited.rstrip(".,")):
            if not list(ROOT.glob(pattern)):
                missing.append(pattern)
    assert not missing, f"{page.relative_to(ROOT)} cites result files that do not exist: {missing}"
