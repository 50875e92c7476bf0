#!/usr/bin/env bash
# Set everything up (cached venv, SmolLM2 converted once) and run the demo:
# serve a real model with kvtier, then show cold vs restored time to first token.
# Extra arguments go to `kvtier demo`, e.g. `bash scripts/demo.sh --tokens 2000`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$repo/scripts/setup.sh")
# `--shared` needs redis-server: install it (as root, with apt) when missing. Where that cannot
# be done, `kvtier demo --shared` exits 2 and says so.
case " $* " in
  *" --shared "*) bash "$repo/scripts/redis-server.sh" ||
       echo "[kvtier demo] could not install redis-server (see above)" >&2 ;;
esac
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$venv/bin/python" -m kvtier.cli demo "$@"
