#!/usr/bin/env bash
# Host tests under AddressSanitizer + UndefinedBehaviorSanitizer (the "asan" presets: build/asan).
# Without arguments, the part CI runs within its time budget (~6 min on 2 cores): the unit tests of
# core, data, checkpoints, optimizers, flags, layers, the transformer block and the schedules, and
# the multi-rank collectives, grid, pipeline executor, data-parallel, ZeRO and dp-equals-sequential
# layouts (1–8 ranks); with arguments, those test targets (or `all`: every host test).
# MPI's own allocations at exit are not leaks of ours: the preset turns leak checking off.
#   bash scripts/asan-check.sh [test targets… | all]
# DPML_JOBS sets the build and test parallelism (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/.."
jobs="${DPML_JOBS:-$(nproc)}"
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(test_core test_token_data test_image_data test_checkpoint test_optim test_args test_layers
           test_pipeline_schedule test_pipeline_executor test_transformer_block test_collectives test_grid
           test_data_parallel test_distributed_optimizer test_dp_equals_sequential)
fi
cmake --preset asan >/dev/null
if [[ "${targets[0]}" == all ]]; then
  cmake --build --preset asan --parallel "$jobs"
  ctest --preset asan --parallel "$jobs"
else
  cmake --build --preset asan --parallel "$jobs" --target "${targets[@]}"
  regex="^($(IFS='|'; echo "${targets[*]}"))(_np[0-9]+)?$"
  ctest --preset asan --parallel "$jobs" -R "$regex"
fi
