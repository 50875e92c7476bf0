"""Regenerate the tables in docs/ that are read from the code: options and metrics.

    PYTHONPATH=src $(bash scripts/setup.sh)/bin/python scripts/gen_docs.py          # rewrite
    PYTHONPATH=src $(bash scripts/setup.sh)/bin/python scripts/gen_docs.py --check  # 1: stale

A docs page holds a generated table between two markers::

    <!-- generated: NAME -->
    ...
    <!-- end generated -->

and this script replaces what lies between them with ``REGIONS[NAME]()``; the rest of the page
is written by hand. Tables come from the code's own metadata, so a new field or metric shows up
without touching this script: settings fields from every public pydantic model in
``kvtier.settings`` (description from ``description=`` or the ``#:`` comment above the field),
the restore policy from ``kvtier.policy.settings`` as the engine builds it, ``kvtier serve``'s
options from its Typer command, metrics from ``kvtier.vllm.metrics.metric_definitions()``.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
COMMAND = "PYTHONPATH=src $(bash scripts/setup.sh)/bin/python scripts/gen_docs.py"
REGION = re.compile(
    r"(<!-- generated: (?P<name>[\w-]+) -->\n)(?P<body>.*?)(<!-- end generated -->)", re.S
)


def _cell(text: object) -> str:
    """One markdown table cell: one line, pipes escaped."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _comments_above(cls: type) -> dict[str, str]:
    """``#:`` comments directly above each ``name: type`` line of a class body (Sphinx style)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return {}
    found: dict[str, str] = {}
    pending: list[str] = []
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("#:"):
            pending.append(stripped[2:].strip())
            continue
        match = re.match(r"(\w+)\s*:", stripped)
        if match and pending:
            found.setdefault(match.group(1), " ".join(pending))
        pending = []
    return found


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _size_default(name: str, value: Any) -> str:
    """Sizes in binary units, as people write them (``2GiB``)."""
    if name.endswith("_bytes") and isinstance(value, int) and not isinstance(value, bool):
        from kvtier.units import format_size

        return format_size(value)
    return _default(value)


def _settings_models() -> list[type]:
    """The component models of ``kvtier.settings`` in the order the module defines them: every
    public pydantic model with fields (a shared base class without fields is left out)."""
    from pydantic import BaseModel

    import kvtier.settings as settings

    return [
        obj
        for name, obj in vars(settings).items()
        if isinstance(obj, type)
        and issubclass(obj, BaseModel)
        and obj.__module__ == settings.__name__
        and not name.startswith("_")
        and obj.model_fields
    ]


def options_table() -> str:
    """One table per settings model: field, user option, default, meaning."""
    from pydantic_core import PydanticUndefined

    parts = []
    for model in _settings_models():
        comments = _comments_above(model)
        rows = []
        for name, info in model.model_fields.items():
            extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
            option = extra.get("option") or ""
            if info.is_required():
                default = "required"
            elif info.default is PydanticUndefined:
                default = "computed"
            else:
                default = _size_default(name, info.default)
            meaning = info.description or comments.get(name) or ""
            rows.append([f"`{name}`", f"`{option}`" if option else "", default, meaning])
        title = getattr(model, "component", model.__name__)
        doc = (inspect.getdoc(model) or "").split("\n")[0].replace("``", "`")
        parts.append(
            f"**{title}** (`{model.__name__}`): {doc}\n\n"
            + _table(["field", "option (Python / CLI)", "default", "meaning"], rows)
        )
    return "\n".join(parts)


def _argument_docs(doc: str) -> dict[str, str]:
    """``name: text`` entries of a docstring (continuation lines indented deeper)."""
    found: dict[str, str] = {}
    names: list[str] = []
    for line in inspect.cleandoc(doc).splitlines():
        match = re.match(r"([a-z_][\w, ]*):\s+(.*)", line)
        if match and not line.startswith(" "):
            names = [n.strip() for n in match.group(1).split(",")]
            for name in names:
                found[name] = match.group(2)
        elif line.startswith(" ") and names:
            for name in names:
                found[name] += " " + line.strip()
        else:
            names = []
    return {k: v.replace("``", "`") for k, v in found.items()}


def python_table() -> str:
    """``kvtier.kv_transfer_config()``'s arguments: name, default, meaning (its docstring)."""
    from kvtier.transfer_config import kv_transfer_config

    docs = _argument_docs(kv_transfer_config.__doc__ or "")
    rows = []
    for name, param in inspect.signature(kv_transfer_config).parameters.items():
        default = "required" if param.default is param.empty else _default(param.default)
        rows.append([f"`{name}`", default, docs.get(name, "")])
    return _table(["argument", "default", "meaning"], rows)


def _fields(obj: Any) -> list[tuple[str, Any]]:
    """(name, value) of a settings object's fields: a pydantic model or a dataclass."""
    if dataclasses.is_dataclass(obj):
        return [(f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)]
    return [(name, getattr(obj, name)) for name in type(obj).model_fields]


def _value_rows(obj: Any, prefix: str = "") -> list[list[object]]:
    """One row per field of ``obj``, nested settings flattened as ``outer_inner``."""
    comments = _comments_above(type(obj))
    rows: list[list[object]] = []
    for name, value in _fields(obj):
        if dataclasses.is_dataclass(value) or hasattr(type(value), "model_fields"):
            rows += _value_rows(value, prefix=f"{prefix}{name}_")
            continue
        rows.append([f"`{prefix}{name}`", _default(value), comments.get(name, "")])
    return rows


def policy_table() -> str:
    """The restore policy as an engine builds it (not options: fixed by design)."""
    import time

    from kvtier.runtime.engine_policy import make_policy

    rows = _value_rows(make_policy(True, time.monotonic).settings)
    # The one value that depends on the engine: how its prefill evidence is timed.
    timed = make_policy(True, time.monotonic, prefill_timed_to_steps=True).settings
    for row in rows:
        if row[0] == "`safety_factor_within_evidence`":
            row[1] = (
                f"`{timed.safety_factor_within_evidence}` where prefill is timed to the step "
                f"that computed it (kvtier's CUDA spec), else {row[1]}"
            )
    return _table(["setting", "value in the engine", "meaning"], rows)


def serve_table() -> str:
    """``kvtier serve``'s own options, from its Typer command."""
    import typer

    from kvtier.cli.main import app

    # Typer may vendor its own click, so options are recognised by their kind, not their class.
    command = typer.main.get_command(app).commands["serve"]  # type: ignore[attr-defined]
    rows = []
    for param in command.params:
        if param.param_type_name != "option" or param.hidden or param.name == "help":
            continue
        names = " / ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        if param.is_flag and not param.secondary_opts:
            default = "off" if not param.default else "on"
        elif param.secondary_opts:
            default = "on" if param.default else "off"
        else:
            default = "unset" if param.default is None else f"`{param.default}`"
        rows.append([names, default, param.help or ""])
    return _table(["option", "default", "meaning"], rows)


def metrics_table() -> str:
    """kvtier's Prometheus metrics as its tiers declare them to vLLM."""
    from kvtier.vllm.metrics import metric_definitions

    rows = []
    for name, meta in metric_definitions().items():
        kind = type(meta).__name__.removeprefix("Offloading").removesuffix("Metadata").lower()
        exposed = f"{name}_total" if kind == "counter" else name
        labels = ", ".join(f"`{label}`" for label in meta.labelnames)
        rows.append([f"`{exposed}`", kind, labels, meta.documentation])
    return _table(["metric", "type", "labels", "meaning"], rows)


REGIONS: dict[str, Callable[[], str]] = {
    "python-options": python_table,
    "options": options_table,
    "serve-options": serve_table,
    "policy": policy_table,
    "metrics": metrics_table,
}


def render(text: str) -> str:
    """``text`` with every generated region rewritten; an unknown region name is an error."""

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in REGIONS:
            raise SystemExit(f"gen_docs: unknown region '{name}'; known: {sorted(REGIONS)}")
        return match.group(1) + "\n" + REGIONS[name]() + "\n" + match.group(4)

    return REGION.sub(replace, text)


def stale_pages() -> dict[Path, str]:
    """Pages whose generated regions differ from the code, with their regenerated text."""
    out = {}
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        if "<!-- generated: " not in text:
            continue
        fresh = render(text)
        if fresh != text:
            out[page] = fresh
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args(argv)
    stale = stale_pages()
    for page, fresh in stale.items():
        if args.check:
            print(f"stale: {page.relative_to(ROOT)}", file=sys.stderr)
        else:
            page.write_text(fresh)
            print(f"rewrote {page.relative_to(ROOT)}")
    if args.check and stale:
        print(f"regenerate with: {COMMAND}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
