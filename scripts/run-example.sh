#!/usr/bin/env bash
# Installs what is missing, builds the main example with the "cpu" preset and runs it on 4 ranks:
# the ResNet-style CNN trained on Fashion-MNIST with data parallelism (about 6 minutes on 2 cores,
# ≥ 91% test accuracy; see bench/RESULTS.md).
#   bash scripts/run-example.sh [flags for the example, replacing its defaults]
# MPIEXEC (default mpiexec) and MPIEXEC_FLAGS (e.g. "--allow-run-as-root --oversubscribe" for
# Open MPI as root) change how it is launched; DPML_JOBS sets the build parallelism.
set -euo pipefail

# The main example: the target examples/<example>/<example>, its ranks and default flags.
example=fashion_mnist
ranks=4
example_args=(--epochs 6)
if (( $# > 0 )); then example_args=("$@"); fi

cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset cpu
cmake --build --preset cpu --parallel "${DPML_JOBS:-$(nproc)}" --target "$example"
# shellcheck disable=SC2086  # MPIEXEC_FLAGS is a list of words
exec "${MPIEXEC:-mpiexec}" -n "$ranks" ${MPIEXEC_FLAGS:-} "build/cpu/examples/$example/$example" "${example_args[@]}"
