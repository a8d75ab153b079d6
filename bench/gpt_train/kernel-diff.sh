#!/usr/bin/env bash
# Per-kernel time of one GPT step, the fused model against the composed one, on this machine's
# GPUs (Nsight Compute; see kernel_diff.py): each model runs gpt_train --cuda-profile under ncu,
# rank 0's report becomes a CSV in DIR, and kernel_diff.py prints the difference.
#
#   bench/gpt_train/kernel-diff.sh [-n RANKS] [-o DIR] [gpt_train flags...]
#   e.g. bench/gpt_train/kernel-diff.sh -n 2 --tp 2 --steps 3 --warmup 2
#
# Needs build/cuda-openmpi/bench/gpt_train/gpt_train (cmake --build --preset cuda-openmpi --target gpt_train).
set -euo pipefail
cd "$(dirname "$0")/../.."
ranks=1
dir=build/cuda-openmpi/kernel-diff
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) ranks="$2"; shift 2 ;;
    -o) dir="$2"; shift 2 ;;
    *) break ;;
  esac
done
mkdir -p "$dir"
bin=build/cuda-openmpi/bench/gpt_train/gpt_train
for model in fused composed; do
  # %q{...}: each rank's report under its own name (Open MPI's and Slurm's rank variables).
  scripts/launch.sh -n "$ranks" ncu --profile-from-start off --clock-control none --cache-control none \
    --metrics gpu__time_duration.sum -f -o "$dir/$model.%q{OMPI_COMM_WORLD_RANK}" \
    "$bin" --cuda-profile --model "$model" "$@" > "$dir/$model.log" 2>&1 ||
    { tail -20 "$dir/$model.log"; exit 1; }
  grep '"bench":"gpt_train"' "$dir/$model.log" || true
  ncu -i "$dir/$model.0.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum > "$dir/$model.csv"
done
python3 bench/gpt_train/kernel_diff.py "$dir/fused.csv" "$dir/composed.csv"
