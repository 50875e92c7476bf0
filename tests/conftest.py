"""Shared fixtures: models built once per session, engines closed even when a test fails."""

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtier.bench.harness import EngineConfig, ProcessEngine


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` tests run only when asked for: a ``-m`` expression that names slow or faults.

    So plain ``pytest`` (CI) and ``-m "not engine"`` skip them, ``-m faults`` runs the whole
    fault suite, and ``-m "faults and not slow"`` its fast part.
    """
    if re.search(r"\b(slow|faults)\b", config.getoption("markexpr") or ""):
        return
    slow = [item for item in items if item.get_closest_marker("slow") is not None]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item.get_closest_marker("slow") is None]


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    from tests.support.models import tiny_llama

    return tiny_llama()


@pytest.fixture(scope="session")
def engine_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("engine-logs")


@pytest.fixture(scope="module")
def start_engine(engine_logs: Path) -> Iterator[Callable[..., ProcessEngine]]:
    """Start engines for one test module; every one still running is closed at module end."""
    started: list[ProcessEngine] = []

    def start(config: EngineConfig, name: str) -> ProcessEngine:
        engine = ProcessEngine(config, engine_logs / f"{name}.log")
        started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()


@pytest.fixture(scope="session")
def plain_engine(tiny_model: Path, engine_logs: Path) -> Iterator[ProcessEngine]:
    """The tiny model without offloading, shared by every module: the resume oracle's engine."""
    engine = ProcessEngine(
        EngineConfig(model=str(tiny_model), in_process=True), engine_logs / "plain.log"
    )
    yield engine
    engine.close()
