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

echo "== pytest tests/store tests/format on CPython 3.12 (the GPU hosts' Python)"
# The disk index's transactions take another path on 3.12 (kvtier.store.disk.index: scripts
# inside a transaction, which 3.11's sqlite3 cannot run), so its tests run on both. The
# venv holds kvtier's own dependencies only (scripts/setup-py312.sh); no Python 3.12 on the
# machine skips this leg, saying so. Skipped when arguments were given, as above.
if [ "$#" -eq 0 ]; then
  status=0
  venv312=$(bash "$repo/scripts/setup-py312.sh") || status=$?
  if [ "$status" -eq 3 ]; then
    echo "skipped: no CPython 3.12 on this machine (set KVTIER_PYTHON312 to one)"
  elif [ "$status" -ne 0 ]; then
    exit "$status"
  else
    "$venv312/bin/python" -m pytest -p no:cacheprovider --durations=5 "${workers[@]}" \
      tests/store tests/format
  fi
fi
