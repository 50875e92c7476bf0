"""Adapters that plug kvtier into vLLM's offloading extension points.

Everything vLLM-specific lives here; the storage core (``kvtier.store``) knows nothing of vLLM.
Importing this package imports no vLLM module: each adapter module imports vLLM itself.
"""
