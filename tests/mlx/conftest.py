"""The MLX tests need MLX with a backend (``mlx[cpu]`` on Linux, in requirements/dev.txt)."""

import pytest

try:
    import mlx.core  # noqa: F401
except ImportError as exc:  # the [mlx] extra, or its Linux backend, is not installed
    pytest.skip(f"MLX is not importable here ({exc})", allow_module_level=True)
