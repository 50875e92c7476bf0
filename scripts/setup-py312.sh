#!/usr/bin/env bash
# Build (once) the cached virtual environment in which the disk store's tests run on CPython
# 3.12, and print its path; print nothing and exit 3 where this machine has no Python 3.12.
#
# Why a second Python: the GPU hosts (and most CUDA deployments) run 3.12, and the disk
# index's transactions take another path there (kvtier.store.disk.index: 3.12's sqlite3 can
# run a script inside a transaction, 3.11's cannot). No engine: the store knows nothing of
# vLLM. Like scripts/setup.sh, the venv lives outside the clone, keyed by its requirements,
# this script and the interpreter's version, and counts as built once `.complete` exists.
# KVTIER_PYTHON312 names the interpreter; else python3.12 on PATH, else pyenv's.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache_root=${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}
requirements="$repo/requirements/py312.txt"

python=${KVTIER_PYTHON312:-}
if [ -z "$python" ]; then
  python=$(command -v python3.12 2>/dev/null || true)
  # pyenv's shim exists for every version it knows but runs only the selected one.
  if [ -z "$python" ] || ! "$python" -c '' 2>/dev/null; then
    python=$(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)
  fi
fi
if [ -z "$python" ] || ! "$python" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
  echo "[kvtier setup-py312] no Python 3.12 here (set KVTIER_PYTHON312)" >&2
  exit 3
fi

key=$(cat "$requirements" "${BASH_SOURCE[0]}" <("$python" -c 'import sys; print(sys.version)') |
      sha256sum | cut -c1-16)
venv="$cache_root/venvs-py312/$key"

if [ ! -f "$venv/.complete" ]; then
  mkdir -p "$cache_root/venvs-py312"
  exec 9>"$cache_root/venvs-py312/.lock"
  flock 9
  if [ ! -f "$venv/.complete" ]; then
    echo "[kvtier setup-py312] building venv $venv with $python (a minute, once)" >&2
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip --disable-pip-version-check -q install -r "$requirements" >&2
    touch "$venv/.complete"
  fi
  exec 9>&-
fi
echo "$venv"
