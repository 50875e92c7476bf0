#!/usr/bin/env bash
# Set everything up (cached venv, SmolLM2 converted once) and run the demo:
# serve a real model with kvtier, then show cold vs restored time to first token.
# Extra arguments go to `kvtier demo`, e.g. `bash scripts/demo.sh --tokens 2000`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$repo/scripts/setup.sh")
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$venv/bin/python" -m kvtier.cli demo "$@"
