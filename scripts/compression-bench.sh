#!/usr/bin/env bash
# Gradient compression on 2 GPUs (Step 14 item 2): train_gpt data parallel over 2 GPUs with its
# gradient buckets reduced exactly, by PowerSGD and by top-k, as a user launches it (a GPU machine
# with 2 GPUs; a few minutes after the build).
#
# GPT-2 124M's shapes over the fortunes bytes (vocabulary 256), bf16, T 1024, global batch 32 in
# micro-batches of 16 (one per GPU and step), --train-iters steps from the same seed, then the
# validation loss. Per run: the median tokens/s over the steps after --warmup, the bytes each rank
# sent per step against the uncompressed reduction's, and the final validation loss against the
# uncompressed run's (the accuracy cost).
#
# Usage: scripts/compression-bench.sh [--steps N] [--warmup N] [--powersgd-rank "4"] [--topk-ratio "0.01"]
# Needs the cuda-openmpi build of train_gpt (built here if missing) and the fortunes text in
# build-data/fortunes (device tool: carry ["build-data"]) or /usr/share/games/fortunes. JSON lines
# land in $RESULTS (default build/cuda-openmpi/compression-bench).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=300 warmup=20 ranks="4" ratios="0.01"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --powersgd-rank) ranks=$2; shift 2 ;;
    --topk-ratio) ratios=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "compression-bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

build=build/cuda-openmpi
results=${RESULTS:-$build/compression-bench}
source scripts/lib/gpu-build.sh
train_gpt_bench_setup "$build" "$results"

# run NAME [train_gpt flags...]: one training run on 2 GPUs, its metrics in $results/NAME.jsonl
run() {
  local name=$1
  shift
  echo "== $name: $*"
  scripts/launch.sh -n 2 "$build/examples/train_gpt/train_gpt" --device cuda --model-size 124m --data-path "$data" \
    --micro-batch 16 --global-batch 32 --train-iters "$steps" --eval-interval "$steps" --log-interval 50 \
    --sample-tokens 0 --metrics "$results/$name.jsonl" "$@" | tail -n 3
}

run none
names=none
for r in $ranks; do run "powersgd-r$r" --grad-compression powersgd --powersgd-rank "$r"; names+=" powersgd-r$r"; done
for k in $ratios; do run "topk-$k" --grad-compression topk --topk-ratio "$k"; names+=" topk-$k"; done

python3 - "$results" "$warmup" $names <<'PY'
import json, math, statistics, sys
results, warmup, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def rows(name):
    return [json.loads(l) for l in open(f"{results}/{name}.jsonl")]
def val(rs):
    return [r["val_loss"] for r in rs if isinstance(r.get("val_loss"), (int, float)) and math.isfinite(r["val_loss"])][-1]
base = rows("none")
base_rate, base_val = statistics.median(r["tokens_per_s"] for r in base if r["step"] > warmup), val(base)
print("| gradients | tokens/s | vs exact | MB sent per rank and step | vs exact bytes | final val loss | vs exact |")
print("|---|---:|---:|---:|---:|---:|---:|")
for name in names:
    rs = rows(name)
    rate = statistics.median(r["tokens_per_s"] for r in rs if r["step"] > warmup)
    wire = statistics.median(r["wire_bytes"] for r in rs if r["step"] > warmup)
    dense = statistics.median(r["dense_bytes"] for r in rs if r["step"] > warmup)
    v = val(rs)
    print(f"| {name} | {rate:.0f} | {rate / base_rate:.3f} | {wire / 1e6:.1f} | {wire / dense:.4f} | {v:.4f} | {100 * (v / base_val - 1):+.2f} % |")
PY
