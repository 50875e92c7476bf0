#!/usr/bin/env bash
# Re-cut the offline bundle of build-bundle.sh for a machine reached by calls that each carry at
# most 64 MiB with the working tree: DEST/a holds the first 50 MiB of the vLLM archive, DEST/b
# the rest of it, the wheels, kvtier and SHA256SUMS (over the joined archive). Send a in one
# call (`on-host.sh stage DEST/a`), b in the next (`on-host.sh unpack DEST/b`).
# Usage: split-for-transfer.sh BUNDLE_DIR DEST
set -euo pipefail
bundle=${1:?usage: split-for-transfer.sh BUNDLE_DIR DEST}
dest=${2:?usage: split-for-transfer.sh BUNDLE_DIR DEST}
repo=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$dest/a" "$dest/b" && mkdir -p "$dest/a" "$dest/b"
joined=$(mktemp); trap 'rm -f "$joined"' EXIT
cat "$bundle"/vllm-0.25.1-fa3only.tar.xz.part* > "$joined"
split -b 50M -d "$joined" "$dest/a/vllm.part"
mv "$dest"/a/vllm.part0[1-9] "$dest/b/"
cp "$bundle/deps-cp312-site.tar.xz" "$bundle/kvtier-site.tar.xz" "$dest/b/"
{ sha256sum "$joined" | sed "s#$joined#vllm.tar.xz#"
  (cd "$bundle" && sha256sum deps-cp312-site.tar.xz kvtier-site.tar.xz); } > "$dest/b/SHA256SUMS"
git -C "$repo" rev-parse --short HEAD > "$dest/b/kvtier-commit.txt"
du -sh "$dest/a" "$dest/b"
