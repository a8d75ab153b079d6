#!/usr/bin/env bash
# Per-kernel time of one GPT step under two configurations of gpt_train, on this machine's GPUs:
# each runs gpt_train --cuda-profile with the common flags plus its own (--a, --b), and rank 0's
# kernels of that step are compared — e.g. a change's effect (GELU saved or recomputed, a schedule,
# ZeRO-1). (Until Step 8 it compared the hand-fused model against the composed one.)
#
#   bench/gpt_train/kernel-diff.sh [-n RANKS] [-o DIR] [--timeline] --a "FLAGS" --b "FLAGS" [common gpt_train flags...]
#   e.g. bench/gpt_train/kernel-diff.sh --a "--recompute-granularity selective" --b "--recompute-granularity none" --steps 3 --warmup 2
#        bench/gpt_train/kernel-diff.sh -n 2 --a "" --b "--use-distributed-optimizer" --steps 3 --warmup 2
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
flags_a="" flags_b="" have_a=0 have_b=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n) ranks="$2"; shift 2 ;;
    -o) dir="$2"; shift 2 ;;
    --timeline) timeline=1; shift ;;
    --a) flags_a="$2" have_a=1; shift 2 ;;
    --b) flags_b="$2" have_b=1; shift 2 ;;
    *) break ;;
  esac
done
if [[ $have_a == 0 || $have_b == 0 ]]; then
  echo "kernel-diff.sh: give both configurations, --a \"FLAGS\" and --b \"FLAGS\" (either may be \"\")" >&2
  exit 2
fi
mkdir -p "$dir"
bin=build/cuda-openmpi/bench/gpt_train/gpt_train
tracer=$PWD/build/cuda-openmpi/bench/timeline/libdpml_cupti_trace.so
if [[ $timeline == 1 && ! -f $tracer ]]; then
  echo "kernel-diff.sh: $tracer is missing (scripts/cupti-fetch.sh here, carry build/cupti, configure with CUPTI_ROOT=$PWD/build/cupti, build dpml_cupti_trace)" >&2
  exit 1
fi
for model in a b; do
  read -r -a own <<<"$([[ $model == a ]] && echo "$flags_a" || echo "$flags_b")"
  if [[ $timeline == 1 ]]; then
    CUDA_INJECTION64_PATH=$tracer DPML_TRACE_OUT="$dir/$model" \
      scripts/launch.sh -n "$ranks" "$bin" --cuda-profile "$@" ${own[@]+"${own[@]}"} > "$dir/$model.log" 2>&1 ||
      { tail -20 "$dir/$model.log"; exit 1; }
  else
    # %q{...}: each rank's report under its own name (Open MPI's and Slurm's rank variables).
    scripts/launch.sh -n "$ranks" ncu --profile-from-start off --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum -f -o "$dir/$model.%q{OMPI_COMM_WORLD_RANK}" \
      "$bin" --cuda-profile "$@" ${own[@]+"${own[@]}"} > "$dir/$model.log" 2>&1 ||
      { tail -20 "$dir/$model.log"; exit 1; }
    ncu -i "$dir/$model.0.ncu-rep" --csv --page raw --metrics gpu__time_duration.sum > "$dir/$model.csv"
  fi
  grep '"bench":"gpt_train"' "$dir/$model.log" || true
done
if [[ $timeline == 1 ]]; then
  for ((r = 0; r < ranks; ++r)); do
    python3 bench/timeline/timeline.py "$dir/a.r$r.csv" "$dir/b.r$r.csv"
  done
else
  python3 bench/gpt_train/kernel_diff.py "$dir/a.csv" "$dir/b.csv"
fi
