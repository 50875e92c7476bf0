"""Build recipe of kvtier's C extensions; the project's metadata is in pyproject.toml.

They are compiled whenever kvtier is built: ``pip install .``, a wheel, an sdist install, or
``python setup.py build_ext --inplace`` for a clone (scripts/setup.sh). Each is optional:
without a C compiler the build warns and goes on, and kvtier uses its Python paths at run time.

* ``kvtier.native._streamcopy``: the host pool's streaming-store page copier (x86-64 only;
  without it, ``memmove`` per page).
* ``kvtier.native._recordread``: the disk tier's record read (open, checks, read, checksum) in
  one GIL-free call per block (Linux; without it, the same steps in Python).
* ``kvtier.native._recordwrite``: the disk tier's record writes (open, write, close, rename)
  in one GIL-free call per batch of records (POSIX; without it, the same steps in Python).
* ``kvtier.native._sockread``: the shared tier's receive of one record's value, and of a
  thread's share of a load's records, in one GIL-free call (POSIX; without it, a Python
  ``recv_into`` loop and a GET per record).
"""

import filecmp
import os
import shutil

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

NATIVE = "src/kvtier/native"


class ReplacingBuildExt(build_ext):
    """``build_ext`` whose ``--inplace`` step swaps the library in with a rename.

    setuptools rewrites the in-place copy on every run; a process of the same clone (a demo
    server, a test engine) may have that file mapped, and truncating a mapped library can crash
    it. An unchanged library is left alone; a changed one replaces the old file atomically.
    """

    def copy_file(  # type: ignore[override]
        self, infile: str, outfile: str, *args: object, **kwargs: object
    ) -> tuple[str, bool]:
        if os.path.exists(outfile) and filecmp.cmp(infile, outfile, shallow=False):
            return outfile, False
        partial = f"{outfile}.{os.getpid()}.partial"
        shutil.copy2(infile, partial)
        os.replace(partial, outfile)
        return outfile, True


# -O3 as CPython builds its own extensions: a CFLAGS set in the environment replaces Python's
# flags, optimisation included, and the reader's checksum then ran 5x slower (measured).
COMPILE_ARGS = ["-O3", "-fno-strict-aliasing"]


def native_extension(name: str, sources: list[str], depends: list[str]) -> Extension:
    """One of kvtier's optional C extensions (files under src/kvtier/native), built for the
    stable ABI: one build serves every CPython >= 3.11 (requires-python)."""
    return Extension(
        f"kvtier.native.{name}",
        sources=[f"{NATIVE}/{source}" for source in sources],
        depends=[f"{NATIVE}/{header}" for header in depends],
        define_macros=[("Py_LIMITED_API", "0x030B0000")],
        py_limited_api=True,
        extra_compile_args=COMPILE_ARGS,
        optional=True,
    )


streamcopy = native_extension(
    "_streamcopy", ["streamcopy.c", "streamcopy_module.c"], ["streamcopy.h"]
)
recordread = native_extension(
    "_recordread",
    ["recordread.c", "xxh3.c", "recordread_module.c"],
    ["recordread.h", "claim.h", "xxh3.h"],
)
recordwrite = native_extension(
    "_recordwrite", ["recordwrite.c", "recordwrite_module.c"], ["recordwrite.h"]
)
sockread = native_extension(
    "_sockread",
    ["sockread.c", "xxh3.c", "sockread_module.c"],
    ["sockread.h", "claim.h", "xxh3.h"],
)

setup(
    ext_modules=[streamcopy, recordread, recordwrite, sockread],
    cmdclass={"build_ext": ReplacingBuildExt},
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
)
