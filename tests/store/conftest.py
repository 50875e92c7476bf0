"""Fixtures shared by the store tests: namespaces and disk store factories."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtier.format import Namespace
from kvtier.store import DiskStore
from tests.support.store import disk_capacity, make_namespace


@pytest.fixture
def namespace() -> Namespace:
    return make_namespace()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "kvroot"


@pytest.fixture
def open_disk(root: Path, namespace: Namespace) -> Iterator[Callable[..., DiskStore]]:
    """Factory for disk stores on ``root``; every store it makes is closed at teardown."""
    opened: list[DiskStore] = []

    def factory(records: int = 8, **kwargs: object) -> DiskStore:
        kwargs.setdefault("capacity_bytes", disk_capacity(records))
        kwargs.setdefault("free_space_floor_bytes", 0)
        store = DiskStore(kwargs.pop("root", root), kwargs.pop("namespace", namespace), **kwargs)
        opened.append(store)
        return store

    yield factory
    for store in opened:
        store.close()
