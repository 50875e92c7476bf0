"""Small native helpers, compiled when kvtier is built (never at run time); Python fallbacks.

``_streamcopy`` (the host pool's page copier) and ``_recordread`` (the disk tier's one-call
record read) are C extensions built by setup.py: by ``pip install`` (wheel or sdist) or, for a
clone, by scripts/setup.sh (``setup.py build_ext --inplace``, ignored by git). Nothing here runs
a compiler. Both are optional: when one is missing (no C compiler when kvtier was built, not
x86-64 for the copier) or fails to load, callers get ``None``, keep their Python path, and the
log says so once per process.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from types import ModuleType

log = logging.getLogger(__name__)

#: Signature of ``copy_pages(n, dst, src, sizes) -> bytes copied``: addresses of uint64 arrays.
PageCopier = Callable[[int, int, int, int], int]

#: Signature of ``read_record(path, header, payload, direct, checksum)``: see recordread.h.
RecordReader = Callable[
    [bytes, memoryview, memoryview, bool, bool], tuple[int, int, int, int, bool, int | None]
]

_MODULE = "kvtier.native._streamcopy"
_READER_MODULE = "kvtier.native._recordread"


def _load(module_name: str, unavailable: str) -> ModuleType | None:
    """Import one native module, or log why not (``unavailable`` says what is used instead)."""
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        log.warning("kvtier: %s (%s)", unavailable, exc)
        return None


@functools.cache
def page_copier() -> PageCopier | None:
    """The streaming-store page copier (releases the GIL), or None where it was not built.

    Cached per process: the import is tried once and the warning logged once.
    """
    module = _load(
        _MODULE,
        "native page copier unavailable; host pool copies use memmove (slower). It is "
        "compiled when kvtier is installed with a C compiler on x86-64.",
    )
    if module is None:
        return None
    copier: PageCopier = module.copy_pages
    return copier


def copier_name() -> str:
    """Which copier ``page_copier()`` gives, in words, for benchmark reports."""
    if page_copier() is None:
        return "memmove per page: native copier not built"
    return "streaming stores"


@functools.cache
def record_reader() -> RecordReader | None:
    """The one-call record reader (releases the GIL once per block), or None where it was not
    built. Cached per process, like ``page_copier``."""
    module = _load(
        _READER_MODULE,
        "native record reader unavailable; disk reads use Python's calls, which wait for the "
        "GIL several times per block. It is compiled when kvtier is installed with a C "
        "compiler on Linux.",
    )
    if module is None:
        return None
    reader: RecordReader = module.read_record
    return reader
