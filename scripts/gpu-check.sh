#!/usr/bin/env bash
# The check to run on a GPU machine after any change to CUDA code: the README's GPU build of every
# target (cmake --preset cuda-openmpi && cmake --build --preset cuda-openmpi: the library's header
# checks, tests, examples, benchmarks), then every test labelled gpu (layers on CudaSpace against
# float64, kernels, the composed GPT and ResNets, the NCCL / comm::Staged layouts, resilience_gpu,
# the consumer project's GPU layer) and a table of what passed. One GPU runs the multi-rank tests
# over comm::Staged; two or more over NCCL. NCCL_NVLS_ENABLE=0 (TOOLCHAIN.md).
#
# Usage: scripts/gpu-check.sh [ctest arguments, e.g. -R layers]
# Exit status: non-zero if the build or any test failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
cmake --preset cuda-openmpi
cmake --build --preset cuda-openmpi --parallel "$(nproc)"
ctest --preset gpu-openmpi --output-on-failure "$@"
