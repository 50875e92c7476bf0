#!/usr/bin/env bash
# Set everything up (cached venv, models) and run kvtier's checks and test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not engine"`.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=$(bash "$repo/scripts/setup.sh")
bash "$repo/scripts/redis-server.sh"  # the shared-tier tests need redis-server on PATH
bash "$repo/scripts/server-binaries.sh" "$venv/bin/python"  # ... and Valkey and Redis 6.2
cd "$repo"
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1

echo "== ruff"
"$venv/bin/python" -m ruff check src tests benchmarks
"$venv/bin/python" -m ruff format --check src tests benchmarks
echo "== pytest"
# Two workers where there are two cores: most of the suite's time is engines starting, which is
# mostly single-threaded Python, so two run side by side in about the time of one. Each test
# file stays on one worker (--dist loadfile): its module-scoped engines start once and its
# tests run in order. Files go to the workers in collection order (--no-loadscope-reorder:
# xdist would otherwise start the files with the most tests first, and the one-test files
# that take minutes last); tests/conftest.py puts the longest first.
# The 25 slowest tests are listed at the end so a run shows where the time goes; a later
# --durations or -n among the arguments overrides these.
workers=()
if [ "$(nproc)" -ge 2 ]; then workers=(-n 2 --dist loadfile --no-loadscope-reorder); fi
"$venv/bin/python" -m pytest -p no:cacheprovider --durations=25 "${workers[@]}" "$@"

echo "== pytest tests/vllm034 (vLLM 0.34.0's scheduler side, its own venv)"
# A second environment with vLLM 0.34.0's CUDA build (built once and cached, several GB; the
# main run above skips this folder). Skipped when arguments were given: they select tests of
# the main run.
if [ "$#" -eq 0 ]; then
  venv034=$(bash "$repo/scripts/setup-vllm034.sh")
  "$venv034/bin/python" -m pytest -p no:cacheprovider --durations=5 tests/vllm034
fi
