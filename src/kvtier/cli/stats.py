"""``kvtier stats``: per-tier figures of a running vLLM server, once, live, recorded or plotted.

Reads ``URL/metrics`` (figures computed by ``kvtier.metrics_view``). Results go to stdout,
diagnostics to stderr. Exit codes: 0 fine, 1 the plot could not be made (matplotlib missing),
2 usage error, 3 the server (or the ``--from`` file) cannot be read.

A recorded run (``--record FILE``) is JSON lines, one per sample: ``{"t": unix seconds, "url":
..., **View.to_dict()}``, appended, so several runs can share a file.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from kvtier.metrics_view import MetricsFormatError, TierFigures, View, view_of
from kvtier.units import format_size

OK, FAILED, USAGE, UNREADABLE = 0, 1, 2, 3
TIMEOUT_S = 10


class Unreadable(Exception):
    """The metrics could not be read; the message says what and where."""


def metrics_url(url: str) -> str:
    """``URL/metrics`` (a URL already ending in ``/metrics`` is kept)."""
    url = url.rstrip("/")
    return url if url.endswith("/metrics") else url + "/metrics"


def fetch_view(url: str, timeout_s: float = TIMEOUT_S) -> View:
    """The view of the server at ``url``; raises ``Unreadable`` with the reason."""
    target = metrics_url(url)
    try:
        with urllib.request.urlopen(target, timeout=timeout_s) as resp:
            text = resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or exc
        raise Unreadable(f"cannot read {target}: {reason}") from None
    try:
        return view_of(text)
    except MetricsFormatError as exc:
        raise Unreadable(f"{target}: {exc}") from None


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _bytes(value: float | None) -> str:
    return "-" if value is None else format_size(value)


def _failures(t: TierFigures) -> str:
    parts = [
        f"{label} {value:,.0f}"
        for label, value in (
            ("load", t.load_failures),
            ("dropped", t.stores_dropped),
            ("abandoned", t.loads_abandoned),
            ("store", t.store_failures),
        )
        if value
    ]
    return ", ".join(parts) or "0"


#: The table's rows: label, cell of one tier.
_ROWS: list[tuple[str, Callable[[TierFigures], str]]] = [
    ("vLLM tier", lambda t: t.vllm_tier or "(inside disk)"),
    (
        "hit rate (chunk hits / queries)",
        lambda t: (
            "-"
            if t.hit_rate is None
            else f"{100 * t.hit_rate:.1f} % ({t.chunk_hits:,.0f}/{t.chunk_queries:,.0f})"
        ),
    ),
    ("tokens restored", lambda t: _num(t.tokens_restored)),
    (
        "prefill time saved",
        lambda t: "-" if t.prefill_saved_s is None else f"{t.prefill_saved_s:.2f} s",
    ),
    ("bytes read (restores)", lambda t: _bytes(t.bytes_read)),
    ("bytes written (stores)", lambda t: _bytes(t.bytes_written)),
    (
        "restore bandwidth",
        lambda t: (
            "-" if t.restore_bytes_per_s is None else f"{format_size(t.restore_bytes_per_s)}/s"
        ),
    ),
    ("failures", _failures),
    (
        "quarantined",
        lambda t: ", ".join(f"{r} {n:,.0f}" for r, n in sorted(t.quarantined.items())) or "0",
    ),
    ("evicted", lambda t: _num(t.evicted)),
    (
        "used / cap",
        lambda t: (
            "-"
            if t.used_bytes is None
            else f"{format_size(t.used_bytes)} / "
            + ("-" if t.capacity_bytes is None else format_size(t.capacity_bytes))
        ),
    ),
]


def render(view: View, url: str) -> Any:
    """A Rich renderable: one column per tier, then where prompt tokens came from."""
    from rich.console import Group
    from rich.table import Column, Table
    from rich.text import Text

    table = Table(
        Column("figure"),
        *(Column(t.tier, justify="right") for t in view.tiers),
        title=f"kvtier tiers of {metrics_url(url)} (since the server started)",
    )
    for label, cell in _ROWS:
        table.add_row(label, *(cell(t) for t in view.tiers))
    if not view.tiers:
        table.add_row("(no tier has been asked for a block yet)")
    p = view.prompt_tokens
    lines = [
        f"prompt tokens: computed {_num(p.get('local_compute'))}, engine cache "
        f"{_num(p.get('local_cache_hit'))}, restored by the connector "
        f"{_num(p.get('external_kv_transfer'))} (by source: "
        + ", ".join(f"{s} {v:,.0f}" for s, v in view.cached_tokens.items() if v)
        + ")",
    ]
    if view.prefill_s_per_token is None:
        lines.append("prefill time saved: unknown (no prefill measured yet)")
    else:
        lines.append(
            f"prefill time saved ≈ {view.prefill_saved_s or 0:.2f} s = restored tokens x "
            f"{view.prefill_s_per_token * 1e3:.3f} ms/token ({view.prefill_source})"
        )
    return Group(table, Text("\n".join(lines)))


def record(path: Path, view: View, url: str, now: float | None = None) -> None:
    """Append one sample to a recorded run."""
    line = {"t": time.time() if now is None else now, "url": metrics_url(url), **view.to_dict()}
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def read_recording(path: Path) -> list[dict[str, Any]]:
    """The samples of a recorded run; raises ``Unreadable`` naming the bad line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise Unreadable(f"cannot read {path}: {exc.strerror or exc}") from None
    samples = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
            View.from_dict(sample)  # checks the shape
        except (ValueError, TypeError) as exc:
            raise Unreadable(f"{path}:{number}: not a kvtier stats sample ({exc})") from None
        samples.append(sample)
    if not samples:
        raise Unreadable(f"{path}: no samples; record some with kvtier stats URL --record FILE")
    return samples


def _fail(message: str, code: int) -> None:
    typer.echo(f"kvtier: {message}", err=True)
    raise typer.Exit(code)


def _warn_if_empty(view: View, url: str) -> None:
    if not view.offloading:
        typer.echo(
            f"kvtier: {metrics_url(url)} shows no offloading metrics: is the server running "
            "with kvtier (kvtier serve)?",
            err=True,
        )


def _watch(url: str, interval_s: float, record_to: Path | None, first: View) -> None:
    """Refresh in place until Ctrl-C; a failed read is reported once and retried."""
    from rich.console import Console
    from rich.live import Live

    err = Console(stderr=True)
    failing = False
    view = first
    with Live(render(view, url), auto_refresh=False) as live:
        try:
            while True:
                time.sleep(interval_s)
                try:
                    view = fetch_view(url)
                except Unreadable as exc:
                    if not failing:
                        err.print(f"kvtier: {exc}; retrying every {interval_s:g} s", markup=False)
                    failing = True
                    continue
                if failing:
                    err.print("kvtier: reading again", markup=False)
                failing = False
                if record_to is not None:
                    record(record_to, view, url)
                live.update(render(view, url), refresh=True)
        except KeyboardInterrupt:
            pass
    typer.echo("kvtier: stopped (Ctrl-C)", err=True)


def stats(
    url: Annotated[
        str | None,
        typer.Argument(help="URL of a running vLLM server, e.g. http://127.0.0.1:8000."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
    watch: Annotated[
        float | None,
        typer.Option("--watch", metavar="SECONDS", help="Refresh every SECONDS until Ctrl-C."),
    ] = None,
    record_to: Annotated[
        Path | None,
        typer.Option("--record", metavar="FILE", help="Append each sample to FILE (JSON lines)."),
    ] = None,
    plot: Annotated[
        Path | None,
        typer.Option("--plot", metavar="PNG", help="Draw the dashboard of a recorded run."),
    ] = None,
    from_file: Annotated[
        Path | None,
        typer.Option("--from", metavar="FILE", help="The recorded run for --plot."),
    ] = None,
) -> None:
    """Per-tier hit rate, restored tokens, bytes, failures and prefill time saved of a server.

    Reads URL/metrics: vLLM's per-tier offloading metrics and kvtier's own. Figures are
    cumulative since the server started. Prefill time saved is an estimate: restored tokens x
    the measured prefill seconds per token (kvtier:prefill_seconds_per_token; without it,
    vLLM's prefill-time histogram over the prompt tokens it computed).

    Example: kvtier stats http://127.0.0.1:8000 --watch 5 --record run.jsonl
    """
    if plot is not None or from_file is not None:
        if plot is None or from_file is None:
            _fail("--plot PNG and --from FILE go together", USAGE)
        if url is not None or watch is not None or record_to is not None or as_json:
            _fail("--plot draws a recorded run: give only --plot PNG --from FILE", USAGE)
        from kvtier.cli.stats_plot import plot_recording
        from kvtier.extras import MissingExtraError

        try:
            samples = read_recording(from_file)
            plot_recording(samples, plot)
        except Unreadable as exc:
            _fail(str(exc), UNREADABLE)
        except MissingExtraError as exc:
            _fail(str(exc), FAILED)
        typer.echo(f"wrote {plot} ({len(samples)} samples)")
        return
    if url is None:
        _fail("give the server's URL, e.g. kvtier stats http://127.0.0.1:8000", USAGE)
    if watch is not None and watch <= 0:
        _fail(f"--watch={watch:g}: give a positive number of seconds", USAGE)
    if watch is not None and as_json:
        _fail("--watch refreshes a table; for samples use --record FILE", USAGE)
    try:
        view = fetch_view(url)
    except Unreadable as exc:
        _fail(str(exc), UNREADABLE)
    _warn_if_empty(view, url)
    if record_to is not None:
        try:
            record(record_to, view, url)
        except OSError as exc:
            _fail(f"cannot append to {record_to}: {exc.strerror or exc}", USAGE)
    if watch is not None:
        _watch(url, watch, record_to, view)
        return
    if as_json:
        typer.echo(json.dumps({"url": metrics_url(url), **view.to_dict()}, indent=2))
        return
    from rich.console import Console

    Console(soft_wrap=False).print(render(view, url))


def register(app: typer.Typer) -> None:
    """Add ``kvtier stats`` to the ``kvtier`` app."""
    app.command()(stats)
