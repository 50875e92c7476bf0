#!/usr/bin/env bash
# Offline bundle for running kvtier on vLLM $VLLM_VERSION (default 0.25.1; 0.26.0 also pins
# torch 2.11 and builds the same way) on a GPU host that has
# Python 3.12, torch 2.11.0+cu130 and triton 3.6.0 but no package registry: the vLLM tree cut
# down to what a dense model on Hopper needs, the wheels LLM(...) imports that the host lacks,
# and kvtier itself (pure Python from this checkout; its optional native copier is not needed
# there: vLLM's own GPU worker runs the host pool) with its pure-Python dependencies and xxhash.
# Output in OUT_DIR: vllm-$VLLM_VERSION-fa3only.tar.xz.part00.., deps-cp312-site.tar.xz,
# kvtier-site.tar.xz, SHA256SUMS (each piece at most 60 MiB); with KVTIER_BUNDLE_MOE=1 also
# vllm-moe-kernels.tar.xz (vLLM's fused-MoE kernels, 40 MB: for a MoE shape such as
# qwen3-30b-a3b; extract it into site/ like the other two). On the host:
#   cat vllm-$VLLM_VERSION-fa3only.tar.xz.part0* | python3 -c "import tarfile,sys; tarfile.open(fileobj=sys.stdin.buffer, mode='r|xz').extractall('site')"
#   for t in deps-cp312-site.tar.xz kvtier-site.tar.xz; do python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall('site')" $t; done
#   PYTHONPATH=$PWD/site python3 site/benchmarks_gpu/kvtier_cuda_e2e.py
# Needs: python3 with pip, unzip, xz, split, sha256sum; a few minutes and 1.5 GB of scratch.
set -euo pipefail
OUT_DIR=${1:?usage: [VLLM_VERSION=0.26.0] build-bundle.sh OUT_DIR}
# Releases whose wheels pin the GPU host's torch (2.11.0); 0.27.0 and later pin 2.13 or 2.14.
version=${VLLM_VERSION:-0.25.1}
case $version in
  0.25.1|0.26.0) ;;
  *) echo "build-bundle.sh: VLLM_VERSION=$version pins a torch the GPU host lacks (it has 2.11.0); use 0.25.1 or 0.26.0" >&2; exit 2 ;;
esac
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT_DIR"; OUT_DIR=$(cd "$OUT_DIR" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/wheels" "vllm==$version"
# What LLM(...) imports on the host that it lacks (the versions that ran there with 0.25.1).
# 0.26.0's Requires-Dist differs from 0.25.1's only in packages this list leaves out
# (flashinfer, cutlass-dsl, quack-kernels, tokenspeed-mla, diskcache) and in apache-tvm-ffi's
# pin (0.1.9 -> 0.1.10; the 0.1.15.post2 below served 0.25.1 there), so the list is the same.
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/deps" \
  annotated-types==0.8.0 apache-tvm-ffi==0.1.15.post2 cachetools==8.0.2 cbor2==6.3.0 distro==1.9.0 \
  fastapi==0.136.3 jiter==0.19.0 llguidance==1.7.6 msgspec==0.23.0 openai==2.54.0 openai-harmony==0.0.8 \
  partial-json-parser==0.2.1.1.post7 pybase64==1.5.1 pydantic==2.14.4 pydantic-core==2.50.5 \
  pyzmq==27.3.0 sniffio==1.3.1 starlette==1.10.0 typing-extensions==4.16.0 typing-inspection==0.4.5 \
  xgrammar==0.2.8
# kvtier's own dependencies (requirements/engine.txt pins), pure Python but xxhash.
python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/kvdeps" \
  xxhash==4.1.0 typer==0.29.2 rich==15.0.0 click==8.5.1 shellingham==1.5.4 markdown-it-py==4.3.0 \
  mdurl==0.1.2 pygments==2.21.0 annotated-doc==0.0.7 \
  redis==8.1.0 hiredis==3.5.0 cryptography==50.0.2 cffi==2.1.1 pycparser==3.12
mkdir -p "$work/tree" "$work/site" "$work/kvsite"
unzip -q "$work"/wheels/vllm-"$version"-*.whl -d "$work/tree"
moe=()
if [[ ${KVTIER_BUNDLE_MOE:-0} == 1 ]]; then
  ( cd "$work/tree" && tar -cf - vllm/_moe_C_stable_libtorch.abi3.so | xz -6 -T1 > "$OUT_DIR/vllm-moe-kernels.tar.xz" )
  moe=(vllm-moe-kernels.tar.xz)
fi
# Dropped: optional or never reached for a dense model on Hopper (FA3 is used there, not FA2;
# the MoE kernels unless asked for above, MLA and FP4 kernels, the Rust front end, vendored
# DeepGEMM and Blackwell attention).
rm -rf "$work"/tree/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so "$work"/tree/vllm/_moe_C_stable_libtorch.abi3.so \
  "$work"/tree/vllm/vllm-rs "$work"/tree/vllm/third_party/deep_gemm "$work"/tree/vllm/third_party/fmha_sm100 \
  "$work"/tree/vllm/_flashmla_C.abi3.so "$work"/tree/vllm/_flashmla_extension_C.abi3.so "$work"/tree/vllm/_qutlass_C.abi3.so
find "$work/tree" -name __pycache__ -prune -exec rm -rf {} +
for w in "$work"/deps/*.whl; do unzip -q -o "$w" -d "$work/site"; done
for w in "$work"/kvdeps/*.whl; do unzip -q -o "$w" -d "$work/kvsite"; done
# kvtier from this checkout with the GPU runner beside it. Its native helpers travel only as
# stable-ABI builds (*.abi3.so: any CPython >= 3.11, so also the GPU host's 3.12); without them
# kvtier there would read the disk through its slower Python path and say so in the log.
"$REPO/scripts/setup.sh" >/dev/null
( cd "$REPO/src" && tar -cf - --exclude=__pycache__ --exclude='*.cpython-*.so' kvtier ) | tar -xf - -C "$work/kvsite"
ls "$work"/kvsite/kvtier/native/*.abi3.so >&2 || echo "warning: no native helpers in the bundle" >&2
mkdir -p "$work/kvsite/benchmarks_gpu"
cp "$REPO/benchmarks/gpu/kvtier_cuda_e2e.py" "$work/kvsite/benchmarks_gpu/"
# This machine's redis-server with the libraries it links beyond glibc, for the runner's shared
# tier (KVTIER_E2E_REDIS_SERVER=site/redis-bin/redis-server); the GPU host has no package index.
if server=$(command -v redis-server); then
  mkdir -p "$work/kvsite/redis-bin" && cp "$server" "$work/kvsite/redis-bin/"
  ldd "$server" | awk '$3 ~ /^\// {print $3}' | grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so' \
    | xargs -r cp -L -t "$work/kvsite/redis-bin/"
fi
archive=vllm-$version-fa3only.tar.xz
( cd "$work/tree" && tar -cf - vllm "vllm-$version.dist-info" | xz -6 -T1 > "$work/$archive" )
( cd "$work/site" && tar -cf - . | xz -6 -T1 > "$OUT_DIR/deps-cp312-site.tar.xz" )
( cd "$work/kvsite" && tar -cf - . | xz -6 -T1 > "$OUT_DIR/kvtier-site.tar.xz" )
( cd "$OUT_DIR" && rm -f vllm-*-fa3only.tar.xz.part* \
  && split -b 60M -d "$work/$archive" "$archive.part" \
  && sha256sum deps-cp312-site.tar.xz kvtier-site.tar.xz "${moe[@]}" "$archive".part* > SHA256SUMS \
  && ls -la )
