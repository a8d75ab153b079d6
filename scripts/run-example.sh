#!/usr/bin/env bash
# Installs what is missing, builds the main example with the "cpu" preset and runs it on 4 ranks.
#   bash scripts/run-example.sh [flags for the example, replacing its defaults]
# MPIEXEC (default mpiexec) and MPIEXEC_FLAGS (e.g. "--allow-run-as-root --oversubscribe" for
# Open MPI as root) change how it is launched; DPML_JOBS sets the build parallelism.
set -euo pipefail

# The main example: the target examples/<example>/<example>, its ranks and default flags.
example=process_grid
ranks=4
example_args=(--tp 2)
if (( $# > 0 )); then example_args=("$@"); fi

cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake --preset cpu
cmake --build --preset cpu --parallel "${DPML_JOBS:-$(nproc)}" --target "$example"
# shellcheck disable=SC2086  # MPIEXEC_FLAGS is a list of words
exec "${MPIEXEC:-mpiexec}" -n "$ranks" ${MPIEXEC_FLAGS:-} "build/cpu/examples/$example/$example" "${example_args[@]}"
