#!/usr/bin/env bash
# Set everything up (cached venv, SmolLM2 converted once) and run the demo:
# serve a real model with kvtier, then show cold vs restored time to first token.
# Extra arguments go to `kvtier demo`, e.g. `bash scripts/demo.sh --tokens 2000`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$repo/scripts/setup.sh")
# The demo's shared-tier step needs redis-server; without one (not root, no apt, apt failing)
# the demo runs its other steps and says why it skipped this one.
case " $* " in
  *" --no-shared "*) ;;
  *) bash "$repo/scripts/redis-server.sh" ||
       echo "[kvtier demo] could not install redis-server; the shared-tier step will be skipped" >&2 ;;
esac
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$venv/bin/python" -m kvtier.cli demo "$@"
