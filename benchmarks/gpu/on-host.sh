#!/usr/bin/env bash
# On the GPU host, from the repository root: stage and unpack the pieces of
# split-for-transfer.sh, then run kvtier's GPU measurements with every result of one run packed
# into $OUT/NAME.tgz (one file per run; $OUT: the folder whose files come back, /tmp if unset).
#   on-host.sh stage DIR              copy the first piece to the host's scratch (call 1; a
#                                     MoE bundle's DIR/moe in a call of its own after it)
#   on-host.sh unpack DIR             the rest, checked, unpacked into $KVTIER_GPU_ROOT/site
#   on-host.sh overlay COMMIT [DIR]   this checkout's kvtier (or DIR's, a kvtier package folder
#                                     carried beside it: another version to compare on the same
#                                     host) over the bundle's, its native helpers kept unless
#                                     the source has its own; COMMIT is what machine.txt names
#   on-host.sh machine NAME           what the host is (GPU, CPUs, disk, kvtier commit)
#   on-host.sh disk-read NAME ARGS..  python -m benchmarks disk-read ARGS (no engine)
#   on-host.sh shared-busy NAME ARGS.. python -m benchmarks shared-busy ARGS (carried redis-server)
#   on-host.sh write-cost NAME ARGS.. python -m benchmarks write-cost ARGS (no engine; records
#                                     in the host's scratch, or KVTIER_WC_DIR: /dev/shm takes
#                                     the device out)
#   on-host.sh e2e NAME               the end-to-end runner of this checkout (kvtier: the
#                                     bundle's), configured by KVTIER_E2E_* variables
#   on-host.sh stage-extras DIR       copy DIR's *.tar.xz to the host's scratch (a call of its own
#                                     when they do not fit beside the bundle's pieces)
#   on-host.sh extras [DIR..]         unpack the staged and DIRs' *.tar.xz into the site:
#                                     redis-bin.tar.xz and model.tar.xz into folders of those
#                                     names, any other (the serving and LMCache pieces) into the
#                                     site itself
#   on-host.sh sxs NAME               side_by_side.py: a fresh vLLM OpenAI server per
#                                     configuration and workload, configured by KVTIER_SXS_*
#                                     (py-spy: the extras' tools.tar.xz, when profiling)
# Each run is cut off after KVTIER_GPU_LIMIT_S seconds (default 540), so its results still
# come back inside a 10-minute call.
set -uo pipefail
root=${KVTIER_GPU_ROOT:-/var/tmp/kvtier-gpu}
site=$root/site
out=${OUT:-/tmp}
limit=${KVTIER_GPU_LIMIT_S:-540}
export PYTHONUNBUFFERED=1

results() {  # dir: a fresh results folder for run $1, packed into $out at exit
    dir=$root/results/$1
    rm -rf "$dir" && mkdir -p "$dir"
    trap "tar -czf '$out/$1.tgz' -C '$root/results' '$1'" EXIT
}
need_site() { [ -d "$site/vllm" ] || { echo "on-host.sh: no unpacked bundle in $site (a fresh machine?)" >&2; exit 3; }; }
describe() {
    date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    echo "$(nproc) CPUs"; lscpu | grep -E 'Model name|L3'; free -g | head -2
    df -h "$root" | tail -1; echo "kvtier $(cat "$root/pieces/kvtier-commit.txt" 2>/dev/null)"
}
redis_wrapper() {  # the carried redis-server, finding the libraries carried beside it
    mkdir -p "$root/bin"
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$site/redis-bin" "$site/redis-bin/redis-server" \
        > "$root/bin/redis-server" && chmod +x "$root/bin/redis-server"
}

command=${1:?usage: see the head of on-host.sh}; shift
case $command in
stage)
    mkdir -p "$root/pieces" && cp "${1:?folder}"/* "$root/pieces/" && ls -la "$root/pieces" ;;
unpack)
    cp "${1:?folder}"/* "$root/pieces/" || exit 2
    # SHA256SUMS names the MoE kernels when the bundle has them: then they must be staged.
    cd "$root/pieces" && cat vllm.part0* > vllm.tar.xz && sha256sum -c SHA256SUMS || exit 2
    rm -rf "$site" && mkdir -p "$site"
    archives=(vllm.tar.xz deps-cp312-site.tar.xz kvtier-site.tar.xz)
    grep -q vllm-moe-kernels.tar.xz SHA256SUMS && archives+=(vllm-moe-kernels.tar.xz)
    for t in "${archives[@]}"; do
        python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$t" "$site" || exit 2
    done
    echo "unpacked into $site" ;;
overlay)
    need_site; commit=${1:?commit of this checkout}; source=${2:-src/kvtier}
    cp -r "$source"/. "$site/kvtier/" || exit 2
    echo "$commit ($source over the bundle's)" > "$root/pieces/kvtier-commit.txt"
    echo "kvtier of $commit ($source) over the bundle's in $site" ;;
machine)
    results "${1:?name}"; describe | tee "$dir/machine.txt" ;;
disk-read|shared-busy)
    need_site; results "${1:?name}"; shift; describe > "$dir/machine.txt"
    redis_wrapper
    PATH=$root/bin:$PATH PYTHONPATH=$site:$PWD timeout "$limit" \
        python3 -m benchmarks "$command" --out "$dir" "$@" 2>&1 | grep -v '^\s*$' | tee "$dir/log" | tail -40 ;;
write-cost)
    need_site; results "${1:?name}"; shift; describe > "$dir/machine.txt"
    records=${KVTIER_WC_DIR:-$root/write-cost}/kvtier-write-cost
    rm -rf "$records" && mkdir -p "$records"
    PYTHONPATH=$site:$PWD timeout "$limit" python3 -m benchmarks write-cost --dir "$records" "$@" \
        2>&1 | tee "$dir/log" | tail -40
    rm -rf "$records" ;;
e2e)
    need_site; results "${1:?name}"; describe > "$dir/machine.txt"
    KVTIER_E2E_WORK=${KVTIER_E2E_WORK:-$root/work} PYTHONPATH=$site timeout "$limit" \
        python3 benchmarks/gpu/kvtier_cuda_e2e.py > "$dir/log" 2>&1
    echo "rc $?" >> "$dir/log"
    rm -rf "${KVTIER_E2E_WORK:-$root/work}"
    grep -v 'INFO\|WARNING\|^\[W' "$dir/log" | tail -60 ;;
stage-extras)
    mkdir -p "$root/extras" && cp "${1:?folder}"/*.tar.xz "$root/extras/" && ls -la "$root/extras" ;;
extras)
    need_site
    for t in "$root"/extras/*.tar.xz; do [ -f "$t" ] && echo "$t"; done > "$root/extras.list"
    for d in "$@"; do for t in "$d"/*.tar.xz; do [ -f "$t" ] && echo "$t"; done; done >> "$root/extras.list"
    while read -r t; do
        name=$(basename "$t" .tar.xz); dest=$site
        case $name in redis-bin|model) dest=$site/$name; mkdir -p "$dest" ;; esac
        python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$t" "$dest" || exit 2
        echo "unpacked $name into $dest"
    done < "$root/extras.list" ;;
sxs)
    need_site; results "${1:?name}"; describe > "$dir/machine.txt"
    KVTIER_SXS_OUT=$dir KVTIER_SXS_WORK=${KVTIER_SXS_WORK:-$root/sxs} KVTIER_SXS_TOKENIZER=$site/model \
        KVTIER_SXS_REDIS_SERVER=$site/redis-bin/redis-server KVTIER_SXS_PYSPY=$site/py-spy KVTIER_SXS_BUDGET_S=$((limit - 20)) \
        PYTHONPATH=$site timeout "$limit" python3 benchmarks/gpu/side_by_side.py > "$dir/log" 2>&1
    echo "rc $?" >> "$dir/log"
    grep -v 'INFO\|WARNING\|^\[W' "$dir/log" | tail -80 ;;
*)
    echo "on-host.sh: unknown command $command" >&2; exit 2 ;;
esac
