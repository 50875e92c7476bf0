"""kvtier's development benchmarks: run as ``python -m benchmarks <command>`` from a checkout.

May import ``kvtier`` (the library and its user benches, ``kvtier.bench``) and ``tests.support``
(the throttled disk, tiny random models, the in-process matrix runner); never ``kvtier.cli``,
and nothing in ``kvtier`` or ``tests.support`` imports this package.
"""
