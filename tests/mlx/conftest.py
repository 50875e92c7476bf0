"""The MLX tests need MLX with a backend (``mlx[cpu]`` on Linux, in requirements/dev.txt);
without it only the test that kvtier works without MLX is collected."""

from pathlib import Path

try:
    import mlx.core  # noqa: F401
except ImportError:  # the [mlx] extra, or its Linux backend, is not installed
    collect_ignore = [
        p.name for p in Path(__file__).parent.glob("*.py") if p.name != "test_without_mlx.py"
    ]
