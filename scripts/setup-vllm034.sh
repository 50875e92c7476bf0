#!/usr/bin/env bash
# Build (once) the cached virtual environment with vLLM 0.34.0's CUDA build in which
# tests/vllm034/ runs vLLM's own scheduler side over kvtier's tiers, and print its path.
#
# Like scripts/setup.sh: the venv lives outside the clone, keyed by requirements/vllm034.txt,
# this script and the Python version, and counts as built only once `.complete` exists.
#
# vllm 0.34.0 pins flashinfer-python==0.7.3, a release PyPI does not have, so `pip install
# vllm==0.34.0` cannot resolve. vllm goes in --no-deps, then every requirement its metadata
# lists but that one (torch 2.14.0 as pinned: PyPI's build is CUDA's, which imports without a
# GPU). `pip check` therefore names flashinfer-python alone; its output is kept in the venv
# (pip-check.txt) for the test to hold to that.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${KVTIER_PYTHON:-python3.11}
cache_root=${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}
requirements="$repo/requirements/vllm034.txt"
#: vLLM's requirements that cannot be installed (not published on PyPI).
unavailable="flashinfer-python"

key=$(cat "$requirements" "${BASH_SOURCE[0]}" <("$python" -c 'import sys; print(sys.version)') |
      sha256sum | cut -c1-16)
venv="$cache_root/venvs-vllm034/$key"

log() { echo "[kvtier setup-vllm034] $*" >&2; }

build_venv() {
  log "building venv $venv (several GB of CUDA wheels, once)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  vllm_pin=$(grep -E '^vllm==' "$requirements")
  # The fingerprint script's download (scripts/vllm_fingerprint.py) is reused where present.
  "${pip[@]}" install --no-deps --find-links "$cache_root/wheels" "$vllm_pin" >&2
  "${pip[@]}" install packaging >&2  # to read vLLM's requirements below
  # vLLM's own requirements (no extras), from its installed metadata, but the unavailable ones.
  "$venv/bin/python" - "$unavailable" >"$venv/vllm-requirements.txt" <<'PY'
import re
import sys
from importlib.metadata import requires

from packaging.requirements import Requirement

skip = set(sys.argv[1].split())
for line in requires("vllm") or []:
    req = Requirement(line)
    if req.marker is not None and "extra" in str(req.marker):
        continue
    if re.sub(r"[-_.]+", "-", req.name).lower() in skip:
        continue
    print(line)
PY
  "${pip[@]}" install -r "$venv/vllm-requirements.txt" >&2
  grep -vE '^(#|vllm==|$)' "$requirements" | "${pip[@]}" install -r /dev/stdin >&2
  "$venv/bin/python" -m pip check >"$venv/pip-check.txt" 2>&1 || true
  "$venv/bin/python" -c 'import vllm.v1.kv_offload.tiering.manager, torch, redis, pytest' >&2
  touch "$venv/.complete"
  log "venv ready; pip check: $(tr '\n' ' ' <"$venv/pip-check.txt")"
}

if [ ! -f "$venv/.complete" ]; then
  mkdir -p "$cache_root/venvs-vllm034"
  exec 9>"$cache_root/venvs-vllm034/.lock"
  flock 9
  [ -f "$venv/.complete" ] || build_venv
  exec 9>&-
fi
echo "$venv"
