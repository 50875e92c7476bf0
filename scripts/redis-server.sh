#!/usr/bin/env bash
# Install the distribution's redis-server and redis-tools when `redis-server` is not on PATH.
# Idempotent and quiet: does nothing when a server is already installed. The shared-tier tests
# (tests/shared) start their own throw-away servers on loopback; this only provides the binary.
# Needs root (CI runs as root on a fresh Debian machine); elsewhere it prints what to do.
set -euo pipefail
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "redis-server.sh: no redis-server on PATH; install redis-server and redis-tools" \
         "(until then the shared-tier tests' Redis runs are skipped, and demo --shared uses" \
         "Valkey from scripts/server-binaries.sh)" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
