"""Development tooling: engine drivers, benchmarks, probes, the demo and model fabrication.

The library (``format``, ``store``, ``dataplane``, ``vllm`` adapters, ``config``, sizing,
memory, the CLI's non-development commands) never imports this package; the ``kvtier bench``
and ``kvtier probe`` commands import it lazily.
"""
