# Sourced by the GPU benchmark scripts (gpu-bench.sh, resnet-bench.sh, conv-bench.sh, …): prints the
# GPU, configures BUILD with the cuda-openmpi preset (the log in RESULTS/configure.log, shown on
# failure) and builds the given targets with all cores; torch_ranks launches the PyTorch references
# on several GPUs.
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

# The train_gpt benchmarks (interleaved-bench.sh, compression-bench.sh): train_gpt in BUILD, built
# unless it is there, RESULTS made, and the fortunes text they train on in $data (build-data/fortunes,
# what the device tool carries, else the system's).
#
#   train_gpt_bench_setup BUILD RESULTS
train_gpt_bench_setup() {
  [[ -x $1/examples/train_gpt/train_gpt ]] || gpu_build "$1" "$2" train_gpt
  mkdir -p "$2"
  data=build-data/fortunes
  [[ -e $data ]] || data=/usr/share/games/fortunes
}

# PyTorch's launcher, one process per GPU of this host, on NPROC ranks (torchrun, or the module
# where the script is not on PATH).
#
#   torch_ranks NPROC SCRIPT ARGS...
torch_ranks() {
  local n=$1
  shift
  local launcher=(torchrun)
  command -v torchrun >/dev/null || launcher=(python3 -m torch.distributed.run)
  "${launcher[@]}" --standalone --nproc_per_node "$n" "$@"
}
