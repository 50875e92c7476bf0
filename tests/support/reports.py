"""Where test and benchmark reporters write, and the deliberate step that publishes them.

Reporters (the fault suite's reliability table, the model matrix) write to a report folder,
never to tracked files: ``$KVTIER_REPORT_DIR``, or ``out/reports/`` in the source checkout
(ignored by git). ``python -m benchmarks publish`` copies the reports into ``docs/``.
"""

import os
import shutil
from pathlib import Path

#: Report file name -> the doc it is published as (relative to the checkout).
PUBLISHED = {
    "reliability.md": Path("docs/reliability.md"),
    "model-matrix.md": Path("docs/model-matrix.md"),
}


#: A doc's part from this line on is written by hand (e.g. the soak's results in
#: docs/reliability.md, which the fault suite does not measure); publishing a report over the
#: doc keeps that part.
KEPT_PART = "<!-- kept: the fault suite's report replaces what is above this line only -->"

#: The source checkout these tests live in (tests/support/../..).
CHECKOUT = Path(__file__).resolve().parents[2]


def checkout_dir() -> Path:
    """The source checkout (the one holding these tests)."""
    return CHECKOUT


def report_dir() -> Path:
    """The report folder (created): ``$KVTIER_REPORT_DIR`` (empty counts as unset), else
    ``out/reports`` in the checkout."""
    folder = Path(os.environ.get("KVTIER_REPORT_DIR") or checkout_dir() / "out" / "reports")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def publish(reports: Path, checkout: Path) -> list[tuple[Path, Path | None]]:
    """Copy every report of ``PUBLISHED`` found in ``reports`` over its doc in ``checkout``.

    Returns (doc, report copied) per doc; the report is None where none was found (the doc is
    then left as it is).
    """
    done: list[tuple[Path, Path | None]] = []
    for name, doc in PUBLISHED.items():
        source = reports / name
        if source.is_file():
            target = checkout / doc
            kept = _kept_part(target)
            shutil.copyfile(source, target)
            if kept:
                with open(target, "a") as f:
                    f.write("\n" + kept)
            done.append((target, source))
        else:
            done.append((checkout / doc, None))
    return done


def _kept_part(doc: Path) -> str:
    """The doc's text from ``KEPT_PART`` on ("" if the doc or the line is missing)."""
    try:
        text = doc.read_text()
    except OSError:
        return ""
    at = text.find(KEPT_PART)
    return "" if at < 0 else text[at:]
