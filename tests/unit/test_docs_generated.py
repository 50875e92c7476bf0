"""The docs' generated tables (options, metrics) match the code they are read from."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("gen_docs", module)
    spec.loader.exec_module(module)
    return module


def test_generated_docs_are_up_to_date() -> None:
    gen_docs = _gen_docs()
    stale = gen_docs.stale_pages()
    assert not stale, (
        f"stale generated tables in {sorted(str(p.relative_to(ROOT)) for p in stale)}; "
        f"regenerate with: {gen_docs.COMMAND}"
    )


@pytest.mark.parametrize("region", ["python-options", "options", "serve-options", "metrics"])
def test_every_generated_region_appears_in_docs(region: str) -> None:
    marker = f"<!-- generated: {region} -->"
    pages = [p for p in (ROOT / "docs").rglob("*.md") if marker in p.read_text()]
    assert pages, f"no docs page holds the generated region '{region}'"


def test_a_new_settings_field_shows_up_in_the_options_table(monkeypatch) -> None:
    from pydantic import BaseModel, Field

    import kvtier.settings as settings

    gen_docs = _gen_docs()

    class ProbeSettings(BaseModel):
        """A component that exists only in this test."""

        wait_s: float = Field(
            default=1.5,
            description="Seconds the probe waits.",
            json_schema_extra={"option": "probe_wait_s"},
        )

    ProbeSettings.__module__ = settings.__name__
    monkeypatch.setattr(settings, "ProbeSettings", ProbeSettings, raising=False)
    table = gen_docs.options_table()
    assert "(`ProbeSettings`): A component that exists only in this test." in table
    assert "| `wait_s` | `probe_wait_s` | `1.5` | Seconds the probe waits. |" in table


def test_a_stale_region_is_rewritten_and_an_unknown_one_refused() -> None:
    gen_docs = _gen_docs()
    page = "intro\n<!-- generated: metrics -->\nold table\n<!-- end generated -->\nafter\n"
    fresh = gen_docs.render(page)
    assert "old table" not in fresh
    assert "`kvtier:tier_bytes_read_total` | counter" in fresh
    assert fresh.startswith("intro\n") and fresh.endswith("<!-- end generated -->\nafter\n")
    with pytest.raises(SystemExit, match="unknown region 'nonsense'"):
        gen_docs.render("<!-- generated: nonsense -->\n<!-- end generated -->\n")
