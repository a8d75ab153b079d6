#!/usr/bin/env bash
# Per-kernel time of one GPT step, the fused model against the composed one, on this machine's
# GPUs: each model runs gpt_train --cuda-profile, and rank 0's kernels of that step are compared.
#
#   bench/gpt_train/kernel-diff.sh [-n RANKS] [-o DIR] [--timeline] [gpt_train flags...]
#   e.g. bench/gpt_train/kernel-diff.sh -n 2 --tp 2 --steps 3 --warmup 2
#
# Default: Nsight Compute (kernel_diff.py) — each kernel's own time, kernels serialised.
# --timeline: bench/timeline's CUPTI tracer (timeline.py) — the kernels as they ran, streams
# overlapping: busy and idle time of the compute stream, what ran beside NCCL. Needs the
# dpml_cupti_trace target (CUPTI found at configure time).
# Needs build/cuda-openmpi/bench/gpt_train/gpt_train (cmake --build --preset cuda-openmpi --target gpt_train).
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=1
dir=build/cuda-openmpi/kernel-diff
timeline=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) ranks="$2"; shift 2 ;;
    -o) dir="$2"; shift 2 ;;
    --timeline) timeline=1; shift ;;
    *) break ;;
  esac
done
mkdir -p "$dir"
bin=build/cuda-openmpi/bench/gpt_train/gpt_train
tracer=$PWD/build/cuda-openmpi/bench/timeline/libdpml_cupti_trace.so
if [[ $timeline == 1 && ! -f $tracer ]]; then
  echo "kernel-diff.sh: $tracer is missing (scripts/cupti-fetch.sh here, carry build/cupti, configure with CUPTI_ROOT=$PWD/build/cupti, build dpml_cupti_trace)" >&2
  exit 1
fi
for model in fused composed; do
  if [[ $timeline == 1 ]]; then
    CUDA_INJECTION64_PATH=$tracer DPML_TRACE_OUT="$dir/$model" \
      scripts/launch.sh -n "$ranks" "$bin" --cuda-profile --model "$model" "$@" > "$dir/$model.log" 2>&1 ||
      { tail -20 "$dir/$model.log"; exit 1; }
  else
    # %q{...}: each rank's report under its own name (Open MPI's and Slurm's rank variables).
    scripts/launch.sh -n "$ranks" ncu --profile-from-start off --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum -f -o "$dir/$model.%q{OMPI_COMM_WORLD_RANK}" \
      "$bin" --cuda-profile --model "$model" "$@" > "$dir/$model.log" 2>&1 ||
      { tail -20 "$dir/$model.log"; exit 1; }
    ncu -i "$dir/$model.0.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum > "$dir/$model.csv"
  fi
  grep '"bench":"gpt_train"' "$dir/$model.log" || true
done
if [[ $timeline == 1 ]]; then
  for ((r = 0; r < ranks; ++r)); do
    python3 bench/timeline/timeline.py "$dir/fused.r$r.csv" "$dir/composed.r$r.csv"
  done
else
  python3 bench/gpt_train/kernel_diff.py "$dir/fused.csv" "$dir/composed.csv"
fi
