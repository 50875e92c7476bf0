"""The library never imports kvtier.devtools (only the bench/probe commands do, lazily)."""

import json
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"

#: Every module of these packages is imported, the packages themselves included.
LIBRARY_PACKAGES = ["kvtier.store", "kvtier.format", "kvtier.dataplane", "kvtier.vllm"]
LIBRARY_MODULES = ["kvtier", "kvtier.config", "kvtier.cli.main"]

_PROBE = """
import importlib, json, pkgutil, sys
sys.path.insert(0, sys.argv[1])
names = json.loads(sys.argv[2])
for package in json.loads(sys.argv[3]):
    module = importlib.import_module(package)
    names.append(package)
    names += [m.name for m in pkgutil.walk_packages(module.__path__, package + ".")]
for name in names:
    importlib.import_module(name)
print(json.dumps({
    "imported": names,
    "devtools": sorted(m for m in sys.modules if m.split(".")[:2] == ["kvtier", "devtools"]),
}))
"""


def test_library_modules_do_not_import_devtools() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            _PROBE,
            str(SRC),
            json.dumps(LIBRARY_MODULES),
            json.dumps(LIBRARY_PACKAGES),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The probe really walked the packages (an empty walk would pass vacuously).
    assert "kvtier.vllm.spec" in result["imported"]
    assert "kvtier.store" in result["imported"]
    assert result["devtools"] == []
