# shellcheck shell=bash
# Sourced by scripts/gpu-bench.sh: llm.c (karpathy/llm.c, staged by scripts/llmc-fetch.sh into an ignored
# folder) built and run as a measured reference on the GPU machine. Nothing of llm.c is in the repository:
# the build works on a copy, adapted at build time.
#
#   llmc_build SRC WORK       copy SRC/llm.c to WORK, adapt it to CUDA 13, build train_gpt2cu with cuDNN attention
#                             (USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1); WORK/build.log, make's output
#   llmc_shards DIR B T N     llm.c token shards of random GPT-2 tokens: DIR/llmc_train_000000.bin (N steps of B·T
#                             tokens and one more batch) and DIR/llmc_val_000000.bin (one batch)
#   llmc_run WORK DIR B T WARMUP STEPS LR   train_gpt2cu -e d12 on those shards, WARMUP + STEPS steps

# llmc_link_dir DIR NAME [LIB_DIR]: make -lNAME link. With LIB_DIR (a wheel's lib: libNAME.so.N only), DIR gets a
# libNAME.so link to its library; without, the system's where the linker finds it, else DIR gets a libNAME.so
# link to the versioned library ldconfig knows (drivers ship libnvidia-ml.so.1 only).
llmc_link_dir() {
  local dir=$1 name=$2 libdir=${3:-} found
  if [[ -n $libdir ]]; then
    found=$(ls "$libdir/lib$name.so" "$libdir"/lib"$name".so.* 2>/dev/null | head -1 || true)
  else
    echo 'int main() { return 0; }' | g++ -x c++ - -L/usr/local/cuda/lib64 -l"$name" -o /dev/null 2>/dev/null && return 0
    found=$(ldconfig -p | awk -v n="lib$name.so." 'index($1, n) == 1 { print $NF; exit }')
    [[ -n $found ]] || found=$(find /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/local/cuda/lib64 -maxdepth 1 \
                                 -name "lib$name.so.*" 2>/dev/null | sort | head -1 || true)
  fi
  [[ -n $found ]] || { echo "llm.c: no lib$name to link${libdir:+ in $libdir}" >&2; return 1; }
  ln -sf "$found" "$dir/lib$name.so"
  echo "llm.c: -l$name links $found"
}

llmc_build() {
  local src=$1 work=$2 cuda_major cc cudnn_dir="" cpath=${CPATH:-}
  [[ -f $src/llm.c/train_gpt2.cu && -d $src/cudnn-frontend/include ]] ||
    { echo "llm.c: $src lacks llm.c/ or cudnn-frontend/include/ (scripts/llmc-fetch.sh stages them)" >&2; return 1; }
  command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
  rm -rf "$work" && mkdir -p "$work" && work=$(cd "$work" && pwd) && cp -r "$src/llm.c" "$work/llm.c" || return 1
  ln -s "$(cd "$src/cudnn-frontend" && pwd)" "$work/llm.c/cudnn-frontend"  # the Makefile looks for ./cudnn-frontend
  if [[ -f $src/COMMITS ]]; then sed 's/^/llm.c: staged /' "$src/COMMITS"; fi

  # CUDA 13 dropped cudaMemAdvise(ptr, bytes, advice, int device) for a cudaMemLocation; llm.c calls it
  # once (llmc/cuda_utils.cuh, the managed-memory fallback when cudaMalloc runs out) with cudaCpuDeviceId,
  # the host: the same advice is cudaMemLocation{cudaMemLocationTypeHost, 0} (the id is ignored for host).
  cuda_major=$(nvcc --version | sed -n 's/.*release \([0-9]*\)\..*/\1/p')
  if ((cuda_major >= 13)); then
    local f=$work/llm.c/llmc/cuda_utils.cuh
    [[ $(grep -c 'cudaMemAdvise(.*cudaCpuDeviceId)' "$f") == 1 ]] ||
      { echo "llm.c: expected one cudaMemAdvise(..., cudaCpuDeviceId) in llmc/cuda_utils.cuh: adapt llmc_build" >&2; return 1; }
    sed -i '/cudaMemAdvise(/s/cudaCpuDeviceId)/cudaMemLocation{cudaMemLocationTypeHost, 0})/' "$f"
    echo "llm.c: CUDA $cuda_major: $(grep -o 'cudaMemAdvise(.*0})' "$f")"
  fi

  # cuDNN's headers and library: the system's where the compiler finds them, else the PyTorch wheel's
  # (site-packages/nvidia/cudnn/{include,lib}, whose lib has only libcudnn.so.9: linked through $work/lib).
  mkdir -p "$work/lib"
  if ! echo '#include <cudnn.h>' | g++ -E -x c++ - -I/usr/local/cuda/include >/dev/null 2>&1; then
    cudnn_dir=$(python3 -c 'import nvidia.cudnn as m; print(list(m.__path__)[0])' 2>/dev/null || true)
    [[ -n $cudnn_dir && -f $cudnn_dir/include/cudnn.h ]] || { echo "llm.c: no cudnn.h (system or PyTorch wheel)" >&2; return 1; }
    echo "llm.c: cuDNN from $cudnn_dir"
    cpath=$cudnn_dir/include${cpath:+:$cpath}
  fi
  llmc_link_dir "$work/lib" cudnn "${cudnn_dir:+$cudnn_dir/lib}" || return 1
  llmc_link_dir "$work/lib" nvidia-ml || return 1  # llmc/mfu.h (NVML); drivers ship libnvidia-ml.so.1 only
  # llmc_run's library path, in a file: gpu-bench.sh builds in a background subshell
  echo "${cudnn_dir:+$cudnn_dir/lib}" >"$work/run-library-path"
  # cudnn-frontend ≥ 1.20 compiles kernels of its own through NVRTC (experimental/nvrtc_shim.h), which
  # llm.c's Makefile does not link: NVCC_LDLIBS (empty without NCCL and MPI) carries -lnvrtc.
  local ldlibs=""
  if [[ -f $src/cudnn-frontend/include/cudnn_frontend/experimental/nvrtc_shim.h ]]; then
    ldlibs=-lnvrtc
    llmc_link_dir "$work/lib" nvrtc || return 1
  fi

  cc=$( (nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null || true) | head -1 | tr -d '. ')
  echo "llm.c: make train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY=${cc:-90} NVCC_LDLIBS=$ldlibs"
  (cd "$work/llm.c" && if [[ -n $cpath ]]; then export CPATH=$cpath; fi &&
     LIBRARY_PATH=$work/lib${LIBRARY_PATH:+:$LIBRARY_PATH} make train_gpt2cu USE_CUDNN=1 NO_MULTI_GPU=1 NO_USE_MPI=1 GPU_COMPUTE_CAPABILITY="${cc:-90}" NVCC_LDLIBS="$ldlibs") >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; echo "llm.c: build failed (log: $work/build.log)" >&2; return 1; }
  [[ -x $work/llm.c/train_gpt2cu ]]
}

llmc_shards() {
  local dir=$1 b=$2 t=$3 n=$4
  mkdir -p "$dir"
  # llm.c's shard format (llmc/dataloader.h), as scripts/lib/random_shard.py writes it
  python3 scripts/lib/random_shard.py "$dir/llmc_train_000000.bin=$((b * t * (n + 1) + 1))" \
    "$dir/llmc_val_000000.bin=$((b * t + 1))"
}

# AdamW β 0.9/0.95, ε 1e-8 and clipping at 1.0 are llm.c's fixed choices, as gpt_train's and torch_gpt.py's;
# -c 0.1 is their weight decay (llm.c decays the 2-D weights only); -u: linear warm-up over the warm-up steps,
# then the peak rate (-q 1: no decay). -v/-m: one validation batch before and after the run (untimed), -s 0:
# no sampling; -r 1 recomputes GELU in the backward, gpt_train's default; -z 0, no output dir, no checkpoints.
llmc_run() {
  local work=$1 dir=$2 b=$3 t=$4 warmup=$5 steps=$6 lr=$7
  local ldp
  ldp=$(cat "$work/run-library-path" 2>/dev/null || true)
  [[ -z ${LD_LIBRARY_PATH:-} ]] || ldp=${ldp:+$ldp:}$LD_LIBRARY_PATH
  (cd "$work/llm.c" && if [[ -n $ldp ]]; then export LD_LIBRARY_PATH=$ldp; fi && ./train_gpt2cu -e d12 -i "$dir/llmc_train_*.bin" -j "$dir/llmc_val_*.bin" -b "$b" -t "$t" \
      -x $((warmup + steps)) -l "$lr" -u "$warmup" -q 1.0 -c 0.1 -v 1000000 -m 1 -s 0 -r 1 -z 0 -n 0)
}
