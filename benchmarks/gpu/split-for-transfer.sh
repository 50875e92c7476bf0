#!/usr/bin/env bash
# Re-cut the offline bundle of build-bundle.sh for a machine reached by calls that each carry at
# most 64 MiB with the working tree (about 16 MiB): DEST/a holds the first 40 MiB of the vLLM
# archive, DEST/b the rest of it and kvtier, DEST/c the wheels and SHA256SUMS (over the joined
# archive). Send each in a call of its own: `on-host.sh stage DEST/a`, `on-host.sh stage
# DEST/b`, then `on-host.sh unpack DEST/c`. A bundle built with KVTIER_BUNDLE_MOE=1 also gives
# DEST/moe (vLLM's fused-MoE kernels, 40 MB): stage it in a call before the unpack (`on-host.sh
# stage DEST/moe`); unpack then refuses without it.
# Usage: split-for-transfer.sh BUNDLE_DIR DEST (the bundle holds one vLLM release's archive)
set -euo pipefail
bundle=${1:?usage: split-for-transfer.sh BUNDLE_DIR DEST}
dest=${2:?usage: split-for-transfer.sh BUNDLE_DIR DEST}
repo=$(cd "$(dirname "$0")/../.." && pwd)
rm -rf "$dest/a" "$dest/b" "$dest/c" "$dest/moe" && mkdir -p "$dest/a" "$dest/b" "$dest/c"
joined=$(mktemp); trap 'rm -f "$joined"' EXIT
parts=("$bundle"/vllm-*-fa3only.tar.xz.part*)
releases=$(printf '%s\n' "${parts[@]##*/}" | sed 's/-fa3only.*//' | sort -u)
[[ -f ${parts[0]} && $(wc -l <<< "$releases") == 1 ]] \
    || { echo "split-for-transfer.sh: want one vLLM archive in $bundle, found: $releases" >&2; exit 2; }
cat "${parts[@]}" > "$joined"
echo "$releases" > "$dest/c/vllm-release.txt"
split -b 40M -d "$joined" "$dest/a/vllm.part"
for part in "$dest"/a/vllm.part*; do
    [[ $part == */vllm.part00 ]] || mv "$part" "$dest/b/"
done
cp "$bundle/kvtier-site.tar.xz" "$dest/b/"
cp "$bundle/deps-cp312-site.tar.xz" "$dest/c/"
moe=()
if [[ -f $bundle/vllm-moe-kernels.tar.xz ]]; then
    mkdir -p "$dest/moe" && cp "$bundle/vllm-moe-kernels.tar.xz" "$dest/moe/"
    moe=(vllm-moe-kernels.tar.xz)
fi
{ sha256sum "$joined" | sed "s#$joined#vllm.tar.xz#"
  (cd "$bundle" && sha256sum deps-cp312-site.tar.xz kvtier-site.tar.xz "${moe[@]}"); } > "$dest/c/SHA256SUMS"
git -C "$repo" rev-parse --short HEAD > "$dest/c/kvtier-commit.txt"
du -sh "$dest/a" "$dest/b" "$dest/c" ${moe:+"$dest/moe"}
