#!/usr/bin/env bash
# Installs what is missing, configures and builds dpml with the "cpu" preset (build/cpu: Release,
# no CUDA) and runs the whole test suite. Exits non-zero on any failure.
#   bash scripts/test.sh [extra ctest arguments, e.g. -L packaging]
# DPML_JOBS sets the build and test parallelism (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
jobs="${DPML_JOBS:-$(nproc)}"
cmake --preset cpu
cmake --build --preset cpu --parallel "$jobs"
ctest --preset cpu --parallel "$jobs" "$@"
