"""The import rules between the library, the user's tools, the lab and the tests.

* The library (every ``kvtier`` module outside ``kvtier.cli``, ``kvtier.bench``,
  ``kvtier.probe`` and ``kvtier.demo``) never imports development code, not even lazily inside
  a function: checked on the source, every import statement.
* The CLI imports the user's tools only lazily: importing ``kvtier.cli.main`` (every command
  registered) loads none of them.
* Development code (``kvtier.bench``, ``kvtier.probe``, ``kvtier.demo``, ``benchmarks``) never
  imports ``kvtier.cli``; the lab may import ``tests.support``, never the other way round.
* The library and the operator commands import with vLLM, torch and every optional extra
  absent (tests/unit/test_extras.py checks what those commands then say).
"""

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"

#: Development code inside the wheel: the user's benches, probes and demo.
USER_TOOLS = ("kvtier.bench", "kvtier.probe", "kvtier.demo")
DEVELOPMENT = (*USER_TOOLS, "benchmarks")


def module_name(path: Path) -> str:
    root = SRC if path.is_relative_to(SRC) else REPO
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules_under(folder: Path) -> dict[str, Path]:
    return {module_name(p): p for p in sorted(folder.rglob("*.py"))}


def imported_names(path: Path) -> set[str]:
    """Every module an import statement of ``path`` names, at any depth (lazy ones too)."""
    names: set[str] = set()
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                prefix = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{prefix}.{node.module}" if node.module else prefix
            else:
                module = node.module or ""
            names.add(module)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def offenders(files: dict[str, Path], forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    found = {}
    for module, path in files.items():
        bad = sorted(n for n in imported_names(path) if within(n, forbidden))
        if bad:
            found[module] = bad
    return found


def library_files() -> dict[str, Path]:
    every = modules_under(SRC / "kvtier")
    return {m: p for m, p in every.items() if not within(m, (*USER_TOOLS, "kvtier.cli"))}


def development_files() -> dict[str, Path]:
    every = {**modules_under(SRC / "kvtier"), **modules_under(REPO / "benchmarks")}
    return {m: p for m, p in every.items() if within(m, DEVELOPMENT)}


def test_the_scan_sees_lazy_imports() -> None:
    # The CLI's bench commands import kvtier.bench inside their bodies: the scan must see it,
    # or every rule below would pass vacuously.
    assert "kvtier.bench.ttft" in imported_names(SRC / "kvtier/cli/bench.py")
    assert "kvtier.store.shared" in library_files()
    assert "benchmarks.cli" in development_files() and "kvtier.demo" in development_files()


def test_the_library_never_imports_development_code() -> None:
    assert offenders(library_files(), (*DEVELOPMENT, "tests")) == {}


def test_development_code_never_imports_the_cli() -> None:
    assert offenders(development_files(), ("kvtier.cli",)) == {}


def test_the_wheel_never_imports_the_lab_or_the_tests() -> None:
    assert offenders(modules_under(SRC / "kvtier"), ("benchmarks", "tests")) == {}


def test_test_support_never_imports_the_lab() -> None:
    # The one direction between them: benchmarks reuse the tests' drivers (throttled disk,
    # tiny models, the matrix runner), so test support must not lean on the lab.
    assert offenders(modules_under(REPO / "tests" / "support"), ("benchmarks",)) == {}


_LOADED = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def loaded_after_importing(names: list[str], prelude: str = "") -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", prelude + _LOADED, json.dumps(names)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PYTHONPATH": f"{SRC}:{REPO}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_cli_loads_the_users_tools_only_when_a_command_runs() -> None:
    loaded = loaded_after_importing(["kvtier.cli.main"])
    assert "kvtier.cli.bench" in loaded  # the bench and probe commands are registered
    assert [m for m in loaded if within(m, (*DEVELOPMENT, "tests"))] == []


#: Stands in for an operator box: vLLM, torch and every optional extra are not installed.
ABSENT = ("vllm", "torch", "transformers", "redis", "hiredis", "matplotlib", "psutil", "gguf")
BLOCK = f"""
import importlib.abc, sys

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {ABSENT!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None

sys.meta_path.insert(0, Absent())
"""

#: What the base install must import: the library's storage core and the operator commands.
OPERATOR = [
    "kvtier",
    "kvtier.transfer_config",
    "kvtier.vllm.release",
    "kvtier.settings",
    "kvtier.extras",
    "kvtier.store",
    "kvtier.format",
    "kvtier.policy",
    "kvtier.metrics_view",
    "kvtier.cli.main",
    "kvtier.cli.ops",
    "kvtier.cli.stats",
    "kvtier.cli.size",
]


def test_the_library_and_operator_commands_import_without_vllm_or_extras() -> None:
    loaded = loaded_after_importing(OPERATOR, BLOCK)
    assert "kvtier.cli.ops" in loaded and "kvtier.store.disk.store" in loaded
    assert [m for m in loaded if m.split(".")[0] in ABSENT] == []


# -- the vLLM floor ----------------------------------------------------------------------------
VLLM = ("vllm", "kvtier.vllm")


#: The release package's own module reads which vLLM is installed from distribution metadata
#: and imports no vLLM module (``OPERATOR`` imports it with vLLM absent): the library's
#: configuration asks it which platform the installed build serves.
METADATA_ONLY = "kvtier.vllm.release"


def metadata_only(name: str) -> bool:
    """``name`` is the release package's module or one of its names (not a submodule)."""
    if name == METADATA_ONLY:
        return True
    head, _, tail = name.rpartition(".")
    package = SRC / METADATA_ONLY.replace(".", "/")
    return head == METADATA_ONLY and not (package / f"{tail}.py").exists()


def needs_vllm(module: str, path: Path) -> bool:
    """Whether ``module`` imports vLLM, directly or through another module of kvtier's own
    ``kvtier.vllm`` (the tiers vLLM loads by module path subclass one that does)."""
    return any(
        within(n, VLLM) and not within(module, (n,)) and not metadata_only(n)
        for n in imported_names(path)
    )


def test_the_vllm_package_holds_exactly_the_library_modules_that_import_vllm() -> None:
    misplaced = {}
    for module, path in library_files().items():
        if module == "kvtier.vllm":  # the package's own docstring
            continue
        inside = within(module, ("kvtier.vllm",))
        if inside != needs_vllm(module, path):
            misplaced[module] = "under kvtier.vllm without vLLM" if inside else "imports vLLM"
    assert misplaced == {}
    # Not vacuous: both sides are populated.
    assert needs_vllm("kvtier.vllm.store_tier", SRC / "kvtier/vllm/store_tier.py")
    assert not needs_vllm("kvtier.runtime.jobs", SRC / "kvtier/runtime/jobs.py")
    assert not needs_vllm("kvtier.transfer_config", SRC / "kvtier/transfer_config.py")
    assert metadata_only("kvtier.vllm.release.installed_platform")
    assert not metadata_only("kvtier.vllm.release.api_0_32")


#: A vLLM release number (0.25.1, 0.32.0, ...) in a string.
RELEASE_NUMBER = re.compile(r"\b0\.(2[5-9]|[3-9]\d)\.\d+\b")
#: A bare version ("0.32") compared against: a version test.
VERSION = re.compile(r"^\d+\.\d+(\.\d+)?$")
#: Where a release may be named outside the release package, and why.
NAMES_A_RELEASE = {
    "kvtier.extras": "the [engine] extra's pip pin, as pyproject.toml states it",
}


def docstring_nodes(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            found.add(id(body[0].value))
    return found


def release_mentions(path: Path) -> list[str]:
    """String constants naming a release, and comparisons against a version, in ``path``
    (docstrings aside: they may say which release a fact is about)."""
    tree = ast.parse(path.read_text(), str(path))
    docs = docstring_nodes(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if id(node) not in docs and RELEASE_NUMBER.search(node.value):
                found.append(f"{node.lineno}: {node.value[:60]!r}")
        elif isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                if (
                    isinstance(operand, ast.Constant)
                    and isinstance(operand.value, str)
                    and VERSION.match(operand.value)
                ):
                    found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_release_is_named_or_tested_outside_the_release_package() -> None:
    offending = {
        module: found
        for module, path in modules_under(SRC / "kvtier").items()
        if not within(module, ("kvtier.vllm.release", *NAMES_A_RELEASE))
        and (found := release_mentions(path))
    }
    assert offending == {}
    # Not vacuous: the release package itself names and tells them apart.
    assert release_mentions(SRC / "kvtier/vllm/release/__init__.py")


#: What a role or an ability is asked of: the spec, a tier, a load claim, vLLM's manager.
ROLE_HOLDER = re.compile(r"^(self\._?)?(offloading_)?(spec|tier|claim|manager)s?$")


def probes(path: Path) -> list[str]:
    """``getattr``/``hasattr`` calls on a spec, a tier, a claim or a manager in ``path``, by a
    literal name (a wrapper's delegation by a variable name is not a probe)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and ROLE_HOLDER.match(ast.unparse(node.args[0]))
        ):
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_role_or_ability_is_probed_with_getattr() -> None:
    """Roles are claimed by method (``EngineContext``), abilities declared on the interface
    (``LoadClaim``, ``StoreAbilities``), never found by probing attributes."""
    offending = {m: found for m, p in library_files().items() if (found := probes(p))}
    assert offending == {}


def test_the_probe_scan_sees_a_probe(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "def f(spec, claim, name):\n"
        "    return getattr(spec, 'x', None), hasattr(claim, 'y'), getattr(spec, name)\n"
    )
    assert len(probes(probe)) == 2


def test_the_policy_imports_no_store_module() -> None:
    # The decision is pure: it predicts and learns from what the adapters measure. Its
    # evidence file reaches the disk through kvtier.small_files, which the store uses too.
    policy = modules_under(SRC / "kvtier" / "policy")
    assert "kvtier.policy.evidence_file" in policy
    assert offenders(policy, ("kvtier.store", "kvtier.vllm", "vllm", "torch")) == {}


def test_the_policy_loads_no_store_module() -> None:
    loaded = loaded_after_importing(["kvtier.policy", "kvtier.policy.evidence_file"])
    assert "kvtier.policy.evidence_file" in loaded
    assert [m for m in loaded if within(m, ("kvtier.store",))] == []
