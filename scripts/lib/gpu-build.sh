# Sourced by the GPU benchmark scripts (gpu-bench.sh, resnet-bench.sh, conv-bench.sh): prints the
# GPU, configures BUILD with the cuda-openmpi preset (the log in RESULTS/configure.log, shown on
# failure) and builds the given targets with all cores.
#
#   gpu_build BUILD RESULTS TARGET...
gpu_build() {
  local build=$1 results=$2
  shift 2
  mkdir -p "$results"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
  echo "== build $* in $build"
  cmake --preset cuda-openmpi -B "$build" >"$results/configure.log" 2>&1 || { cat "$results/configure.log"; return 1; }
  cmake --build "$build" --target "$@" -j "$(nproc)"
}
