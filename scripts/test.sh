#!/usr/bin/env bash
# Installs what is missing, configures and builds dpml and runs the whole test suite. Exits
# non-zero on any failure. Where nvcc is found (the CUDA toolkit, with or without a GPU) it uses
# the "cuda" preset (build/cuda), so every CUDA source is compiled too and GPU tests run where a
# GPU is present (reported as skipped where not); otherwise the "cpu" preset (build/cpu).
# DPML_PRESET overrides the choice. Without a GPU (nvidia-smi lists none) the code that only a GPU
# runs is compiled as a check (DPML_GPU_COMPILE_CHECK: device code to PTX, unoptimised; host code
# of GPU-only programs at -O0), which cuts the build by more than half; DPML_GPU_COMPILE_CHECK=OFF
# keeps the full build.
#   bash scripts/test.sh [extra ctest arguments, e.g. -L packaging]
# DPML_JOBS sets the build and test parallelism (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
jobs="${DPML_JOBS:-$(nproc)}"
preset="${DPML_PRESET:-}"
if [[ -z "$preset" ]]; then
  if command -v nvcc >/dev/null 2>&1 || [[ -x /usr/local/cuda/bin/nvcc ]]; then preset=cuda; else preset=cpu; fi
fi
if [[ "$preset" == cuda* ]] && ! command -v nvcc >/dev/null 2>&1; then export PATH="/usr/local/cuda/bin:$PATH"; fi
check="${DPML_GPU_COMPILE_CHECK:-}"
if [[ -z "$check" ]]; then
  if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then check=OFF; else check=ON; fi
fi
cmake --preset "$preset" -DDPML_GPU_COMPILE_CHECK="$check"
cmake --build --preset "$preset" --parallel "$jobs"
ctest --preset "$preset" --parallel "$jobs" "$@"
