"""The disk store's file I/O: how it writes records and how it reads them, each chosen
explicitly.

A store takes one ``RecordIO``; a test injects a fault by passing a writer or a reader of its
own (a subclass overriding one method), and says which reader it tests: the native one-call
reader that production runs where it is built, or the Python steps
(``kvtier.store.disk.reader``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvtier.store.disk.reader import RecordReader, default_reader
from kvtier.store.disk.writer import RecordWriter


@dataclass(frozen=True)
class RecordIO:
    """A record writer and a record reader."""

    #: Writes, publishes and removes record files (and holds the fsync policy).
    writer: RecordWriter = field(default_factory=RecordWriter)
    #: Reads record files: ``default_reader()`` (native where built) unless given.
    reader: RecordReader = field(default_factory=default_reader)

    @property
    def fsync(self) -> str:
        """The writer's fsync policy: "never", "data" or "always"."""
        return self.writer.fsync
