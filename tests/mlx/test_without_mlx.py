"""Without MLX installed, kvtier imports and works as before; only ``kvtier.mlx`` needs it, and
importing it then says what to install. Neither ``kvtier.mlx`` nor its vLLM adapters
(``kvtier.vllm.mlx_*``) import vllm-metal."""

import json
import subprocess
import sys

from tests.unit.test_import_graph import REPO, SRC, modules_under, offenders

#: Stands in for a machine without MLX: ``import mlx`` fails and ``find_spec`` finds nothing,
#: as when it is not installed (others probe for it: transformers does, inside vLLM's import).
NO_MLX = """
import sys
for name in ("mlx", "mlx.core", "mlx_lm"):
    sys.modules[name] = None
"""


def run_without_mlx(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", NO_MLX + code],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env={"PYTHONPATH": f"{SRC}:{REPO}", "PATH": "/usr/bin:/bin"},
    )


def test_kvtier_and_its_cpu_spec_import_and_configure_without_mlx():
    done = run_without_mlx(
        "import json, sys\n"
        "import kvtier, kvtier.vllm.spec, kvtier.vllm.disk_tier, kvtier.store\n"
        "config = kvtier.kv_transfer_config(host_pool='64MiB')\n"
        "print(json.dumps([config['kv_connector_extra_config']['spec_name'],\n"
        "                  sorted(m for m, module in sys.modules.items() if module is not None\n"
        "                         and (m.split('.')[0] in ('mlx', 'mlx_lm')\n"
        "                              or m.startswith('kvtier.mlx')))]))\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["KvtierCpuSpec", []]


def test_importing_kvtier_mlx_without_mlx_names_the_extra():
    done = run_without_mlx(
        "import json\n"
        "try:\n"
        "    import kvtier.mlx\n"
        "except Exception as exc:\n"
        "    print(json.dumps([type(exc).__name__, str(exc)]))\n"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [
        "MissingExtraError",
        "kvtier: kvtier's MLX data plane (kvtier.mlx) needs mlx: pip install "
        '"mlx>=0.32,<0.33" (kvtier\'s [mlx] extra)',
    ]


def test_kvtier_mlx_imports_nothing_from_vllm_metal():
    files = {
        **modules_under(SRC / "kvtier" / "mlx"),
        **{m: p for m, p in modules_under(SRC / "kvtier" / "vllm").items() if ".mlx_" in m},
    }
    assert {"kvtier.mlx.layouts", "kvtier.vllm.mlx_worker", "kvtier.vllm.mlx_spec"} <= set(files)
    assert offenders(files, ("vllm_metal",)) == {}
