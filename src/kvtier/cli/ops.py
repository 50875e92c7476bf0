"""Operator commands over a disk folder: ``kvtier ls``, ``du``, ``verify`` and ``gc``.

Results go to stdout (``--json`` for a machine-readable object), diagnostics to stderr.
Exit codes: 0 fine, 1 problems found, 2 usage or configuration error, 3 the folder cannot be
read. All four are safe while engines serve the folder: ``ls``/``du`` only read the index;
``verify`` opens each namespace as one more store; ``gc`` evicts as a put would.

Encrypted namespaces: record names are keyed MACs, so ``ls`` lists names that cannot be turned
back into block keys, with or without the key. ``verify`` authenticates every record with the
key (``--key-file`` / ``--key-env``), as one tenant's (``--tenant SALT``, default the
requests without a salt): a record whose checksums hold but whose tag fails is another
tenant's or forged (the two cannot be told apart without the other tenant's keys), so it is
counted and never fixed; without the key, it checks each header and ciphertext checksum and
says how many records it could not authenticate. ``gc --retired-keys`` drops the
records no key but a retired one opens. No command prints a key.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from kvtier.errors import ConfigError, KvtierError
from kvtier.units import format_size, parse_size

OK, PROBLEMS, USAGE, UNREADABLE = 0, 1, 2, 3
_AGE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)?\s*$")
_AGE_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

DirArg = Annotated[Path, typer.Argument(help="The disk folder (disk_dir).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON object.")]
KeyFileOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--key-file",
        help="Master key file of an encrypted folder; repeat it after a rotation, the "
        "current key first.",
    ),
]
KeyEnvOpt = Annotated[
    bool, typer.Option("--key-env", help="Read the master keys from KVTIER_MASTER_KEY.")
]
TenantOpt = Annotated[
    str | None,
    typer.Option(
        "--tenant",
        metavar="SALT",
        help="Authenticate the records of the tenant whose requests carry this cache_salt "
        "(with --key-file or --key-env); default: the requests without a salt.",
    ),
]


def _keyring(key_files: list[Path] | None, key_env: bool) -> Any:
    """The key ring the options name, or None when they name none (``ConfigError`` if bad)."""
    if not key_files and not key_env:
        return None
    from kvtier.format.keyfiles import load_keyring
    from kvtier.settings import EncryptionSettings

    return load_keyring(EncryptionSettings(key_files=tuple(key_files or ()), key_env=key_env))


def _encrypted(namespace: Any) -> bool:
    from kvtier.format.sealing import is_sealed_namespace

    return namespace is not None and is_sealed_namespace(namespace)


def parse_age(value: str) -> float:
    """Seconds in an age such as ``90s``, ``15m``, ``12h``, ``30d``, ``2w`` (bare: seconds)."""
    match = _AGE.match(value)
    if match is None:
        raise ConfigError(f"--older-than={value!r} is not an age; use e.g. 12h, 30d or 2w")
    return float(match.group(1)) * _AGE_UNITS[match.group(2) or "s"]


@contextmanager
def _exit_codes() -> Iterator[None]:
    """Map errors to exit codes, with the message on stderr."""
    from kvtier.store.disk.inspect import UnreadableRoot

    try:
        yield
    except ConfigError as exc:
        typer.echo(f"kvtier: {exc}", err=True)
        raise typer.Exit(USAGE) from None
    except (UnreadableRoot, OSError) as exc:
        typer.echo(f"kvtier: cannot read the folder: {exc}", err=True)
        raise typer.Exit(UNREADABLE) from None
    except KvtierError as exc:
        typer.echo(f"kvtier: {exc}", err=True)
        raise typer.Exit(USAGE) from None


def _when(ns: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ns / 1e9)) if ns else "-"


def _emit(as_json: bool, data: dict[str, Any], lines: list[str]) -> None:
    if as_json:
        typer.echo(json.dumps(data, indent=2, default=str))
    else:
        for line in lines:
            typer.echo(line)


def ls(
    disk_dir: DirArg,
    namespace: Annotated[
        str | None, typer.Argument(help="A namespace digest: list its blocks, newest first.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List the namespaces in a disk folder, or one namespace's blocks."""
    from kvtier.store.disk.inspect import namespace_blocks, namespace_summaries

    with _exit_codes():
        summaries = namespace_summaries(disk_dir)
        if namespace is None:
            rows = [_summary_dict(s) for s in summaries]
            lines = [
                f"{r['namespace']}  {r['model']}  weights {r['weights']}  {r['layout']}  "
                f"{r['blocks']} blocks  {format_size(r['bytes'])}  "
                f"newest {_when(r['newest_use_ns'])}  oldest {_when(r['oldest_use_ns'])}"
                + ("  encrypted" if r["encrypted"] else "")
                for r in rows
            ]
            _emit(as_json, {"namespaces": rows}, lines or ["no namespaces"])
            return
        if namespace not in {s.digest_hex for s in summaries}:
            raise ConfigError(f"no namespace {namespace!r} in {disk_dir}; see `kvtier ls DIR`")
        blocks = namespace_blocks(disk_dir, namespace)
        summary = next(s for s in summaries if s.digest_hex == namespace)
        if _encrypted(summary.namespace):
            typer.echo(
                "kvtier: encrypted namespace: the names are keyed MACs of the block keys, "
                "which no key turns back into block keys",
                err=True,
            )
        data = {
            "namespace": namespace,
            "blocks": [
                {
                    "key": b.key.hex(),
                    "record_id": b.record_id,
                    "payload_bytes": b.payload_bytes,
                    "last_use_ns": b.last_use_ns,
                }
                for b in blocks
            ],
        }
        lines = [
            f"{b.key.hex()}  {format_size(b.payload_bytes)}  {_when(b.last_use_ns)}" for b in blocks
        ]
        _emit(as_json, data, lines or ["no blocks"])


def _summary_dict(summary: Any) -> dict[str, Any]:
    ns = summary.namespace
    return {
        "namespace": summary.digest_hex,
        "model": ns.model if ns else "?",
        "weights": (ns.weights_fingerprint.rsplit(":", 1)[-1][:12] or "-") if ns else "?",
        "layout": (
            f"{ns.kv_dtype} {ns.num_layers}x{ns.num_kv_heads}x{ns.head_size} "
            f"{ns.block_size_tokens} tok/block"
            if ns
            else "?"
        ),
        "blocks": summary.blocks,
        "bytes": summary.bytes or 0,
        "newest_use_ns": summary.newest_use_ns or 0,
        "oldest_use_ns": summary.oldest_use_ns or 0,
        "quarantine_bytes": summary.quarantine_bytes,
        "encrypted": _encrypted(ns),
    }


def du(disk_dir: DirArg, as_json: JsonOpt = False) -> None:
    """Bytes and blocks per namespace, the cap, usage, free space and the floor."""
    from kvtier.store.disk.inspect import namespace_summaries, root_usage

    with _exit_codes():
        summaries = namespace_summaries(disk_dir)
        usage = root_usage(disk_dir)
    data = {
        "namespaces": [
            {
                "namespace": s.digest_hex,
                "blocks": s.blocks,
                "bytes": s.bytes or 0,
                "quarantine_bytes": s.quarantine_bytes,
            }
            for s in summaries
        ],
        **asdict(usage),
    }
    cap = usage.capacity_bytes
    lines = [
        f"{s.digest_hex}  {s.blocks} blocks  {format_size(s.bytes or 0)}" for s in summaries
    ] + [
        f"cap {format_size(cap) if cap else 'unset'}; used {format_size(usage.footprint_bytes)} "
        f"(records, trash and quarantine {format_size(usage.used_bytes)} + index files)",
        f"quarantine {usage.quarantine_entries} entries, {format_size(usage.quarantine_bytes)}; "
        f"trash {format_size(usage.trash_bytes)}",
        f"file system: {format_size(usage.fs_free_bytes)} free of "
        f"{format_size(usage.fs_total_bytes)}; floor {format_size(usage.floor_bytes)}",
    ]
    _emit(as_json, data, lines)
    if cap is not None and usage.footprint_bytes > cap:
        typer.echo(f"kvtier: usage {usage.footprint_bytes} exceeds the cap {cap}", err=True)
        raise typer.Exit(PROBLEMS)


def verify(
    disk_dir: DirArg,
    fix: Annotated[bool, typer.Option("--fix", help="Repair what can be repaired.")] = False,
    key_file: KeyFileOpt = None,
    key_env: KeyEnvOpt = False,
    tenant: TenantOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Read every record of every namespace and check it against the index.

    Encrypted records are authenticated with the key as one tenant's (--tenant SALT; default
    the requests without a salt). Records that do not authenticate as that tenant's but whose
    checksums hold are other tenants' (or forged): counted, never fixed. Without the key only
    headers and ciphertext checksums are checked, and the output says how many could not be
    opened.
    Example: kvtier verify /var/cache/kvtier --key-file /etc/kvtier/key --tenant team-a
    """
    from kvtier.store import DiskStore
    from kvtier.store.disk.inspect import namespace_summaries

    unopened: dict[str, int] = {}
    others: dict[str, int] = {}
    with _exit_codes():
        ring = _keyring(key_file, key_env)
        if tenant is not None and ring is None:
            raise ConfigError(
                f"verify --tenant {tenant!r} authenticates with the key; give --key-file or "
                "--key-env too"
            )
        summaries = namespace_summaries(disk_dir)
        results: dict[str, list[dict[str, Any]]] = {}
        total = sum(s.bytes or 0 for s in summaries)
        with _progress(total, sys.stderr.isatty() and not as_json) as advance:
            for summary in summaries:
                if summary.namespace is None:
                    results[summary.digest_hex] = [
                        {"kind": "namespace_file", "detail": "namespace.json missing or unreadable"}
                    ]
                    continue
                sealed = _encrypted(summary.namespace)
                sealer = ring.tenant(tenant) if sealed and ring is not None else None
                digest = summary.digest_hex

                def count(_key_id: bytes, digest: str = digest) -> None:
                    unopened[digest] = unopened.get(digest, 0) + 1

                def count_other(_name: bytes, digest: str = digest) -> None:
                    others[digest] = others.get(digest, 0) + 1

                with DiskStore(disk_dir, summary.namespace, sealer=sealer) as store:
                    problems = store.verify(
                        fix=fix, progress=advance, unopened=count, unauthenticated=count_other
                    )
                results[summary.digest_hex] = [
                    {
                        "kind": p.kind,
                        "detail": p.detail,
                        "path": p.path,
                        "key": p.key.hex() if p.key else None,
                        "fixed": p.fixed,
                    }
                    for p in problems
                ]
    found = sum(len(v) for v in results.values())
    who = "the unsalted requests" if tenant is None else f"tenant {tenant!r}"
    lines = (
        [
            f"{ns}: {p['kind']} {p.get('path') or ''} {p['detail']}"
            + (" (fixed)" if p.get("fixed") else "")
            for ns, problems in results.items()
            for p in problems
        ]
        + [
            f"{ns}: {n} encrypted records not authenticated (no key: header and ciphertext "
            "checksum checked); give --key-file or --key-env to check them"
            for ns, n in unopened.items()
        ]
        + [
            f"{ns}: {n} encrypted records not authenticated as {who}'s: other tenants' (or "
            "forged), left as they are; --tenant SALT checks a tenant's"
            for ns, n in others.items()
        ]
        + [f"{len(summaries)} namespaces, {format_size(total)} read, {found} problems"]
    )
    data = {
        "namespaces": results,
        "problems": found,
        "bytes_read": total,
        "unopened": unopened,
        "tenant": tenant,
        "other_tenants": others,
    }
    _emit(as_json, data, lines)
    if found:
        raise typer.Exit(PROBLEMS)


@contextmanager
def _progress(total: int, visible: bool) -> Iterator[Callable[[int], None]]:
    """A Rich progress bar with bytes and rate on a terminal; nothing otherwise."""
    if not visible:
        yield lambda _n: None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TransferSpeedColumn,
    )

    with Progress(
        BarColumn(), DownloadColumn(), TransferSpeedColumn(), console=Console(stderr=True)
    ) as bar:
        task = bar.add_task("verify", total=total)
        yield lambda n: bar.advance(task, n)


def gc(
    disk_dir: DirArg,
    to: Annotated[
        str | None, typer.Option("--to", help="Evict LRU blocks until usage is at most SIZE.")
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", help="Evict every block of this namespace.")
    ] = None,
    older_than: Annotated[
        str | None, typer.Option("--older-than", help="Evict blocks unused for AGE (e.g. 30d).")
    ] = None,
    quarantine: Annotated[bool, typer.Option("--quarantine", help="Empty the quarantine.")] = False,
    retired_keys: Annotated[
        bool,
        typer.Option(
            "--retired-keys",
            help="Evict the encrypted blocks not written under the current key (the first "
            "--key-file).",
        ),
    ] = False,
    key_file: KeyFileOpt = None,
    key_env: KeyEnvOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Evict blocks (least recently used first) or empty the quarantine."""
    from kvtier.store.disk.gc import collect

    with _exit_codes():
        given = (to, namespace, older_than)
        if all(v is None for v in given) and not quarantine and not retired_keys:
            raise ConfigError(
                "gc: give --to SIZE, --namespace NS, --older-than AGE, --quarantine or "
                "--retired-keys"
            )
        ring = _keyring(key_file, key_env)
        if retired_keys and ring is None:
            raise ConfigError(
                "gc --retired-keys needs the current key: give --key-file (the current key "
                "first) or --key-env"
            )
        result = collect(
            disk_dir,
            to_bytes=None if to is None else parse_size(to, "--to"),
            namespace=namespace,
            older_than_s=None if older_than is None else parse_age(older_than),
            quarantine=quarantine,
            keep_key_ids=(ring.write_key_id,) if retired_keys else None,
        )
    _emit(
        as_json,
        asdict(result),
        [
            f"evicted {result.records} blocks ({format_size(result.record_bytes)}); "
            f"removed {result.quarantine_entries} quarantine entries"
        ],
    )


def register(app: typer.Typer) -> None:
    """Add the commands to the ``kvtier`` app."""
    for command in (ls, du, verify, gc):
        app.command()(command)
