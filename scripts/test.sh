#!/usr/bin/env bash
# Installs what is missing, configures and builds dpml and runs the whole test suite. Exits
# non-zero on any failure. Where nvcc is found (the CUDA toolkit, with or without a GPU) it uses
# the "cuda" preset (build/cuda), so every CUDA source is compiled too and GPU tests run where a
# GPU is present (reported as skipped where not); otherwise the "cpu" preset (build/cpu).
# DPML_PRESET overrides the choice.
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
cmake --preset "$preset"
cmake --build --preset "$preset" --parallel "$jobs"
ctest --preset "$preset" --parallel "$jobs" "$@"
