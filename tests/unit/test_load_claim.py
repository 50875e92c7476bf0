"""The load claim is one typed protocol (``kvtier.store.base.LoadClaim``): the stores call its
methods and never probe a claim for what it can do."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvtier.dataplane.abandonable import AbandonableLoad, LoadState
from kvtier.store.base import FixedClaim, LoadClaim

STORE = Path(__file__).resolve().parents[2] / "src" / "kvtier" / "store"

#: A claim probed for an ability: ``getattr(claim, ...)`` / ``hasattr(claims[i], ...)``.
PROBE = re.compile(r"\b(getattr|hasattr)\(\s*claims?\b")


def test_no_store_module_probes_a_claim_with_getattr() -> None:
    sources = sorted(STORE.rglob("*.py"))
    assert len(sources) > 10, "the scan must see the store's modules"
    found = [
        f"{path.relative_to(STORE)}:{number}: {line.strip()}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), start=1)
        if PROBE.search(line)
    ]
    assert found == []


def test_the_probe_pattern_finds_what_it_forbids() -> None:
    assert PROBE.search('cells = [getattr(claim, "native_cell", None) for claim in claims]')
    assert PROBE.search("if hasattr(claims[i], 'release'):")
    assert not PROBE.search("cells = [claim.native_cell for claim in claims]")


@pytest.mark.parametrize("claim", [AbandonableLoad(), FixedClaim(), FixedClaim(grant=False)])
def test_every_claim_the_library_makes_is_a_load_claim(claim: object) -> None:
    assert isinstance(claim, LoadClaim)


def test_a_fixed_claim_cannot_be_abandoned_nor_given_back() -> None:
    claim = FixedClaim()
    assert claim.claim() and claim.claim(), "the same answer every time"
    claim.written()
    assert not claim.abandoned
    assert claim.release() is False
    assert claim.native_cell is None
    assert FixedClaim(grant=False).claim() is False


def test_an_abandonable_load_gives_its_claim_back() -> None:
    load = AbandonableLoad()
    assert load.claim()
    assert load.release() is True
    assert load.state is LoadState.PENDING
    assert load.claim(), "claimed again after the release"
