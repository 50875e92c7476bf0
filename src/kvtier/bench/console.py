"""Progress and result printing shared by the bench commands (kvtier's and the project's lab)."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

err = Console(stderr=True)


@contextmanager
def progress(title: str) -> Iterator[Callable[[str], None]]:
    """A spinner with elapsed time; each progress line is printed above it (stderr)."""
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
    ) as bar:
        task = bar.add_task(title)

        def report(line: str) -> None:
            bar.console.print(line)
            bar.update(task, description=f"{title}: {line.strip()[:60]}")

        yield report


def print_result(out: Path, stem: str) -> None:
    """The table a run wrote (``out/stem.md``) to stdout, and where its raw data lies."""
    print((out / f"{stem}.md").read_text())
    print(f"raw data and plots: {out}/{stem}.*")
