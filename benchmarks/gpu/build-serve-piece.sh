#!/usr/bin/env bash
# Offline pieces, beside build-bundle.sh's (VLLM_VERSION=0.26.0), for the side-by-side runs on
# the GPU host: vLLM's OpenAI API server (`python -m vllm.entrypoints.openai.api_server`),
# kvtier's workload driver (`python -m kvtier.cli bench workload`) and LMCache 0.5.2 behind vLLM's
# LMCacheConnectorV1. Only cp312 manylinux wheels, unpacked; each piece is one xz tar < 45 MiB.
# Output in OUT_DIR:
#   serve-cp312-site.tar.xz  the API server's and the driver's imports beyond the bundle, and
#                            LMCache 0.5.2 with what its vLLM adapter imports but numba
#   numba-cp312-site.tar.xz  numba and llvmlite, which LMCache imports (39 MiB after xz: with
#                            the rest, more than one piece)
#   SHA256SUMS
# On the host, extract both into their own folder and put it first on the path, the bundle's
# site after it (a package shipped here that the host also has must win):
#   for t in serve numba; do python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall('serve-site')" $t-cp312-site.tar.xz; done
#   PYTHONPATH=$PWD/serve-site:$PWD/site python3 -m vllm.entrypoints.openai.api_server ...
#   PYTHONPATH=$PWD/serve-site:$PWD/site python3 -m kvtier.cli bench workload ...
# The lists below are what importing those entry points needed in a Python 3.12 environment
# made like the host (torch 2.11.0 (CUDA 13 build), triton 3.6.0, transformers 5.17, numpy
# 2.5, cupy-cuda13x) with the bundle first on the path, after adding the modules that
# `from vllm import LLM` imports (those ran on the host, so it has them: cloudpickle, psutil,
# aiohttp, requests, pillow, uvloop, py-cpuinfo, prometheus_client, einops).
# Needs: python3 with pip and PyPI, unzip, xz, sha256sum; five minutes (xz -9 of llvmlite) and
# 700 MB of scratch.
set -euo pipefail
OUT_DIR=${1:?usage: build-serve-piece.sh OUT_DIR}
mkdir -p "$OUT_DIR"; OUT_DIR=$(cd "$OUT_DIR" && pwd)
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
plat=(--only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_26_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64
      --platform manylinux1_x86_64 --platform manylinux_2_5_x86_64)
# The API server: uvicorn with httptools (uvicorn picks it over h11, as in a `pip install vllm`
# through fastapi[standard]; LMCache lists it too; h11 and click come from the host's httpx and
# the bundle), watchfiles, SageMaker's container standards (+ jmespath), the metrics
# middleware; python-multipart only for the transcription routes, small enough to carry anyway.
serve=(uvicorn==0.55.0 httptools==0.9.0 watchfiles==1.3.0 model-hosting-container-standards==0.1.16
       jmespath==1.1.0 prometheus-fastapi-instrumentator==8.1.0 python-multipart==0.0.34)
# `kvtier bench workload` refuses to start without matplotlib (its PNG); httpx is the host's.
# dateutil 2.9 with six rather than 4.0, which wants tzdata.
bench=(matplotlib==3.11.2 contourpy==1.4.0 cycler==0.12.1 fonttools==4.69.1 kiwisolver==1.5.1
       pyparsing==3.3.3 python-dateutil==2.9.0.post0 six==1.17.0)
# LMCache 0.5.2 (the release matched to vLLM 0.26.0) and what
# lmcache.integration.vllm.vllm_v1_adapter imports: numba with its llvmlite (a piece of their
# own; LMCache's Python fallback ops import it and are loaded on CUDA too; 0.68.1 accepts
# numpy 1.22 to 2.5, vLLM's pin 0.65.0 only < 2.5), sortedcontainers, aiofile with caio (the
# GDS backend's, imported with every storage backend); aiofiles only for its fs connector,
# small. Its other Requires-Dist (awscrt, the Google clients, opentelemetry, nixl,
# cufile-python, pytest, ...) are not imported on that path.
lmcache=(lmcache==0.5.2 sortedcontainers==2.4.0 aiofile==3.12.3 caio==0.12.10 aiofiles==25.1.0)
numba=(numba==0.68.1 llvmlite==0.50.0)
piece() {  # name packages...: download, unpack and pack one piece
    local name=$1; shift
    python3 -m pip download -q --no-deps "${plat[@]}" -d "$work/$name.whl" "$@"
    mkdir -p "$work/$name"
    for w in "$work/$name.whl"/*.whl; do unzip -q -o "$w" -d "$work/$name"; done
    # Test suites are never imported at run time (numba's alone is 20 MB).
    rm -rf "$work/$name"/numba/tests "$work/$name"/llvmlite/tests "$work/$name"/matplotlib/tests
    find "$work/$name" -name __pycache__ -prune -exec rm -rf {} +
    ( cd "$work/$name" && tar -cf - . | xz -9 -T1 > "$OUT_DIR/$name.tar.xz" )
}
piece serve-cp312-site "${serve[@]}" "${bench[@]}" "${lmcache[@]}"
piece numba-cp312-site "${numba[@]}"
pieces=(serve-cp312-site.tar.xz numba-cp312-site.tar.xz)
( cd "$OUT_DIR" && sha256sum "${pieces[@]}" > SHA256SUMS && ls -la )
# Each piece must stay under the transfer limit (45 MiB here, ~50 MiB allowed).
for f in "${pieces[@]}"; do
  [[ $(stat -c %s "$OUT_DIR/$f") -lt $((45 * 1024 * 1024)) ]] \
    || { echo "build-serve-piece.sh: $f is 45 MiB or more" >&2; exit 1; }
done
