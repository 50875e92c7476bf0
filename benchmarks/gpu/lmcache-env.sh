# LMCache 0.5.2 as its documentation recommends for KV offloading to CPU RAM and a local disk,
# behind vLLM 0.26.0's in-tree LMCacheConnectorV1. Sourced by the side-by-side runner, which
# starts the server with
#   --kv-transfer-config "$KVTIER_SXS_LMCACHE_KV_TRANSFER_CONFIG"
# and the pieces of build-serve-piece.sh on PYTHONPATH. Sizes come from the variables every
# configuration of the comparison reads, so each gets the same bytes:
#   KVTIER_SXS_CPU_GB    host RAM for KV, in GiB (LMCache multiplies its sizes by 1024**3)
#   KVTIER_SXS_DISK_GB   local disk for KV, in GiB
#   KVTIER_SXS_LMCACHE_DISK_DIR  where LMCache writes its chunk files (default below; a fresh
#                        folder per run keeps one run's disk from serving the next)
# Sources (as data): LMCache's docs, CPU RAM backend
#   https://docs.lmcache.ai/kv_cache/storage_backends/cpu_ram.html
# and local storage backend
#   https://docs.lmcache.ai/kv_cache/storage_backends/local_storage.html
# (repository LMCache/LMCache, docs/source/kv_cache/storage_backends/{cpu_ram,local_storage}.rst);
# names, defaults and units checked against lmcache/v1/config.py of the 0.5.2 wheel.
# LMCache loads its CUDA kernels (lmcache.c_ops) only when CUDA is available and falls back to
# Python ops with a warning when they fail to load: the server log must say
# "Using backend: lmcache.c_ops", not "Failed to import backend" or "using fallback ops".
: "${KVTIER_SXS_CPU_GB:?lmcache-env.sh: set KVTIER_SXS_CPU_GB (GiB of host RAM for KV)}"
: "${KVTIER_SXS_DISK_GB:?lmcache-env.sh: set KVTIER_SXS_DISK_GB (GiB of disk for KV)}"
KVTIER_SXS_LMCACHE_DISK_DIR=${KVTIER_SXS_LMCACHE_DISK_DIR:-${KVTIER_GPU_ROOT:-/var/tmp/kvtier-gpu}/lmcache-disk}
mkdir -p "$KVTIER_SXS_LMCACHE_DISK_DIR"

# With a config file present LMCache ignores LMCACHE_* variables (both pages say so): none here.
unset LMCACHE_CONFIG_FILE
# 256 tokens per chunk: the default, and the value both pages set.
export LMCACHE_CHUNK_SIZE=256
# CPU RAM tier on (the default; the CPU RAM page recommends always keeping it on, also with
# a disk: it is the hot cache in front of the disk and the staging buffer for disk reads).
export LMCACHE_LOCAL_CPU=True
# Pinned host memory reserved up front, GiB.
export LMCACHE_MAX_LOCAL_CPU_SIZE=$KVTIER_SXS_CPU_GB
# Disk tier: off by default; on with a directory (file:// prefix optional), one file per chunk,
# LRU eviction past the size (the local storage page).
export LMCACHE_LOCAL_DISK="file://$KVTIER_SXS_LMCACHE_DISK_DIR/"
export LMCACHE_MAX_LOCAL_DISK_SIZE=$KVTIER_SXS_DISK_GB
# O_DIRECT disk I/O: the local storage page's configuration sets it, for when most CPU memory
# is in use (as here: the CPU tier is full in the comparison). Its value is JSON (the page's
# quoting is not); KVTIER_SXS_LMCACHE_ODIRECT=0 compares without it.
if [[ ${KVTIER_SXS_LMCACHE_ODIRECT:-1} == 1 ]]; then
  export LMCACHE_EXTRA_CONFIG='{"use_odirect": true}'
else
  unset LMCACHE_EXTRA_CONFIG
fi
# The GPU host has no network: LMCache's anonymous usage reports are on by default
# (lmcache/usage_telemetry/identity.py reads this variable).
export LMCACHE_TRACK_USAGE=false
# vLLM's side: its in-tree connector, storing and loading (the role both pages use).
export KVTIER_SXS_LMCACHE_KV_TRANSFER_CONFIG='{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}'
