"""Shared fixtures: models built once per session, engines closed even when a test fails."""

import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kvtier.bench.harness import EngineConfig, ProcessEngine

#: The files that take minutes each, longest first (measured on CI's two cores). They run
#: first: scripts/test.sh hands files to its two workers in collection order, and one of
#: these started last would run alone while the other worker sits idle.
LONGEST_FIRST = (
    "tests/engine/test_model_matrix.py",
    "tests/soak/test_short_soak.py",
    "tests/engine/test_tp_cross_disk.py",
    "tests/engine/test_demo.py",
    "tests/engine/test_bench_smoke.py",
)


#: One compute thread per engine, unbound: the suite runs two workers on two cores, and an
#: engine's default OpenMP team (a thread bound to each core) then waits at every parallel
#: region for a thread whose core the other worker holds, spinning meanwhile: beside one busy
#: process a tiny model's request took 0.13-0.8 s instead of 0.06-0.07 s. Tests read outputs,
#: never speed; set before any test imports torch, so in-process engines and every child
#: (engine processes, servers, runners) inherit it. Exported values win.
ENGINE_THREADS = {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


def pytest_configure(config: pytest.Config) -> None:
    for name, value in ENGINE_THREADS.items():
        os.environ.setdefault(name, value)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``slow`` tests run only when asked for: a ``-m`` expression that names slow or faults.

    So plain ``pytest`` (CI) and ``-m "not engine"`` skip them, ``-m faults`` runs the whole
    fault suite, and ``-m "faults and not slow"`` its fast part. The files of
    ``LONGEST_FIRST`` go first, the rest keep their order.
    """
    rank = {path: n for n, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))
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
