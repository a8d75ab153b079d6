#!/usr/bin/env bash
# The scaling model (tools/scaling-model, train/scaling_model.hpp) against the GPU runs measured
# on the lent machines, then its predictions for 8 × 8 and 32 × 8 H100 clusters — the tables of
# bench/RESULTS.md's "scaling model" section. Runs anywhere (no GPU): needs the cpu (or cuda)
# preset's dpml-scaling-model.
#
#   scripts/scaling-predictions.sh [path/to/dpml-scaling-model]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/cpu/tools/scaling-model/dpml-scaling-model}
[[ -x $bin ]] || { echo "scaling-predictions.sh: $bin is missing (cmake --build --preset cpu --target dpml-scaling-model)" >&2; exit 1; }
field() { sed -n "s/.*\"$1\":\\([^,}]*\\).*/\\1/p"; }

echo "## The model against measured runs (GPT-2 124M, T=1024, bf16; one GPU's tokens/s of the same job as calibration)"
echo
echo "| machine, job | layout | calibration tokens/s (1 GPU) | measured | predicted | predicted / measured |"
echo "|---|---|---:|---:|---:|---:|"
# machine | flags | calibration | measured. Calibrations at --micro-batch 4 are the job's B=16 figure
# × 0.843, one H100's tokens/s at micro-batch 4 over B=16 (389,670-391,383 vs 464,100).
while IFS='|' read -r machine flags calib measured; do
  predicted=$("$bin" --tokens-per-s "$calib" $flags | head -1 | field tokens_per_s)
  printf '| %s | `%s` | %s | %s | %s | %.3f |\n' "$machine" "$flags" "$calib" "$measured" "$predicted" \
    "$(echo "$predicted / $measured" | bc -l)"
done <<'ROWS'
2×H200, 2026-11-24|--dp 2|445500|855584
2×H200, 2026-11-27|--dp 2|488867|938241
2×H200, 2026-11-27|--tp 2|488867|664975
2×H200, 2026-11-27|--pp 2 --schedule zb-h1 --micro-batches 4 --micro-batch 4|412115|642241
2×H200, 2026-11-27|--pp 2 --schedule 1f1b --micro-batches 4 --micro-batch 4|412115|584447
4×H100, 2026-11-26|--dp 4|412802|1563361
4×H100, 2026-11-26|--tp 2 --dp 2|412802|978652
4×H100, 2026-11-26|--tp 2 --pp 2 --schedule 1f1b --micro-batches 4 --micro-batch 4|347992|539554
ROWS

echo
echo "## Predictions: H100 nodes of 8 (NVLink all-reduce 300 GB/s), 400 Gb/s per GPU between nodes (40 GB/s)"
echo
echo "| model | GPUs | layout | grad wire | tokens/s | scaling | step ms | dp exposed ms | bubble ms |"
echo "|---|---:|---|---|---:|---:|---:|---:|---:|"
# model flags (one GPU: GPT-2 124M measured 464,100 tokens/s on an H100; larger ones at 45 % MFU of 896 TFLOP/s)
while IFS='|' read -r name model layout; do
  for wire in "--dp-allreduce flat" "--dp-allreduce hierarchical" "--dp-allreduce hierarchical --compression 0.1"; do
    line=$("$bin" $model $layout $wire | head -1)
    printf '| %s | %s | `%s` | %s | %s | %.1f %% | %s | %s | %s |\n' "$name" "$(echo "$line" | field gpus)" "$layout" \
      "${wire#--dp-allreduce }" "$(echo "$line" | field tokens_per_s)" "$(echo "100 * $(echo "$line" | field scaling)" | bc -l)" \
      "$(echo "$line" | field step_ms)" "$(echo "$line" | field dp_exposed_ms)" "$(echo "$line" | field bubble_ms)"
  done
done <<'ROWS'
GPT-2 124M, T=1024, B=16|--model 124m --tokens-per-s 464100|--dp 64
GPT-2 124M, T=1024, B=16|--model 124m --tokens-per-s 464100|--dp 256
GPT 1.3B, T=2048, B=8|--model 1.3b --seq-length 2048 --micro-batch 8 --calibration-batch 8 --tokens-per-s 0 --mfu 0.45|--dp 64 --zero
GPT 1.3B, T=2048, B=8|--model 1.3b --seq-length 2048 --micro-batch 8 --calibration-batch 8 --tokens-per-s 0 --mfu 0.45|--dp 256 --zero
GPT 6.7B, T=2048, B=2|--model 6.7b --seq-length 2048 --micro-batch 2 --calibration-batch 2 --tokens-per-s 0 --mfu 0.45|--tp 8 --dp 8 --micro-batches 8 --zero
GPT 6.7B, T=2048, B=2|--model 6.7b --seq-length 2048 --micro-batch 2 --calibration-batch 2 --tokens-per-s 0 --mfu 0.45|--tp 8 --dp 32 --micro-batches 8 --zero
GPT 6.7B, T=2048, B=2|--model 6.7b --seq-length 2048 --micro-batch 2 --calibration-batch 2 --tokens-per-s 0 --mfu 0.45|--tp 4 --pp 2 --dp 8 --schedule zb-h1 --micro-batches 16 --zero
ROWS
