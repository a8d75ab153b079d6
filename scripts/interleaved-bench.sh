#!/usr/bin/env bash
# The interleaved 1F1B schedule against 1F1B on 2 GPUs (Step 14 item 3), through train_gpt as a user
# launches it (a GPU machine with 2 GPUs; ~3 minutes after the build).
#
# GPT-2 124M's and 350M's shapes (12 layers of C 768, 24 of C 1024; T 1024) over the fortunes
# bytes (vocabulary 256, so that the last stage's LM head does not outweigh the first stage's
# embedding: at GPT-2's 50304 the head alone costs about five blocks of 124M and the pipeline is
# unbalanced whatever its schedule), bf16, global batch 32 in micro-batches of --micro-batch
# (m = 32 / micro-batch per step): one GPU (the same micro-batches, accumulated), then --pp 2 with
# 1F1B and with interleaved v = 2, 3.
# Per run the median tokens/s over the steps after --warmup. Bubble over compute, measured as
#   2 · t(pp 2) / t(1 GPU) − 1 (everything pp 2 spends beyond half the one-GPU step: idle stages,
#   the activations' transfers, the embedding's two stages), against the schedule's (p−1)/(v·m).
#
# Usage: scripts/interleaved-bench.sh [--steps N] [--warmup N] [--micro-batch "4 8"] [--model-size "124m 350m"]
# Needs the cuda-openmpi build of train_gpt (scripts/gpu-check.sh builds it; built here if missing)
# and the fortunes text in build-data/fortunes (device tool: carry ["build-data"]) or
# /usr/share/games/fortunes. JSON lines land in $RESULTS (default build/cuda-openmpi/interleaved-bench).
set -euo pipefail
cd "$(dirname "$0")/.."

steps=30 warmup=10 micro_batches="4 8" sizes="124m 350m"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --micro-batch) micro_batches=$2; shift 2 ;;
    --model-size) sizes=$2; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ { print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "interleaved-bench.sh: unknown option $1" >&2; exit 2 ;;
  esac
done

build=build/cuda-openmpi
results=${RESULTS:-$build/interleaved-bench}
source scripts/lib/gpu-build.sh
train_gpt_bench_setup "$build" "$results"

# run NAME RANKS SIZE [train_gpt flags...]: one training run, its metrics in $results/NAME.jsonl
run() {
  local name=$1 ranks=$2 size=$3
  shift 3
  echo "== $name: $*"
  scripts/launch.sh -n "$ranks" "$build/examples/train_gpt/train_gpt" --device cuda --model-size "$size" \
    --data-path "$data" --global-batch 32 --train-iters "$steps" --lr-warmup-iters 0 --eval-interval 100000 \
    --log-interval "$steps" --sample-tokens 0 --metrics "$results/$name.jsonl" "$@" | tail -n 2
}

for size in $sizes; do
  for mb in $micro_batches; do
    run "$size-mb$mb-gpu1" 1 "$size" --micro-batch "$mb"
    run "$size-mb$mb-pp2-1f1b" 2 "$size" --micro-batch "$mb" --pp 2 --schedule 1f1b
    for v in 2 3; do
      run "$size-mb$mb-pp2-v$v" 2 "$size" --micro-batch "$mb" --pp 2 --schedule interleaved --num-virtual-stages-per-pipeline-rank "$v"
    done
  done
done

python3 - "$results" "$warmup" "$sizes" $micro_batches <<'EOF'
import json, statistics, sys
results, warmup, sizes, mbs = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), [int(m) for m in sys.argv[4:]]
def rate(name):
    rows = [json.loads(l) for l in open(f"{results}/{name}.jsonl")]
    return statistics.median(r["tokens_per_s"] for r in rows if r["step"] > warmup)
print("| model | micro-batch | m | schedule | tokens/s | vs 1 GPU | bubble/compute measured | (p-1)/(v*m) |")
print("|---|---:|---:|---|---:|---:|---:|---:|")
for size in sizes:
    for mb in mbs:
        m = 32 // mb
        one = rate(f"{size}-mb{mb}-gpu1")
        print(f"| {size} | {mb} | {m} | one GPU | {one:.0f} | 1.00 | | |")
        for label, name, v in (("1F1B", "1f1b", 1), ("interleaved v2", "v2", 2), ("interleaved v3", "v3", 3)):
            r = rate(f"{size}-mb{mb}-pp2-{name}")
            print(f"| {size} | {mb} | {m} | {label} | {r:.0f} | {r / one:.2f} | {100 * (2 * one / r - 1):.1f} % | {100 / (v * m):.1f} % |")
EOF
